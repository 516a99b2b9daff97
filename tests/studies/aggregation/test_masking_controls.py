"""Masking probe: the seeded random-order control, fractions in steps of k/7, and outliers through the one
detection contract (threshold, detection block, preset, or a Detection made once)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from conftest import images, make_model
from interp.errors import InterpError
from interp.hooks.names import resid_post
from interp.studies.aggregation.masking import (MaskingResult, cells_to_mask, fraction_steps, mask_images,
                                                masking_study, random_keys)
from interp.detection.detection import detect
from interp.detection.spec import DetectionSpec
from interp.studies.aggregation.configs import MaskingConfig
from interp.runtime.forward import run_hooks
from interp.runtime.open import open_source

pytestmark = pytest.mark.filterwarnings("ignore:no artifacts")  # random weights have none


@pytest.fixture(scope="module")
def vit():
    return make_model("vit")          # depth 2: a detection block other than the last exists


def test_random_order_is_seeded_nested_and_not_the_score_order():
    scores = torch.arange(2 * 16, dtype=torch.float32).view(2, 4, 4)
    keys = random_keys(2, (4, 4), seed=3)
    assert torch.equal(keys, random_keys(2, (4, 4), seed=3)) and not torch.equal(keys, random_keys(2, (4, 4), 4))
    sets = [cells_to_mask(scores, k, "random", keys) for k in (0, 3, 7, 16)]
    assert [int(s[0].sum()) for s in sets] == [0, 3, 7, 16]
    for small, large in zip(sets, sets[1:]):
        assert not (small & ~large).any()                 # nested: a larger fraction keeps the earlier cells
    expected = keys.flatten(1).argsort(dim=1, descending=True)[:, :7]
    assert set(sets[2][1].flatten().nonzero().flatten().tolist()) == set(expected[1].tolist())
    assert not torch.equal(sets[2], cells_to_mask(scores, 7, "top")) and \
        not torch.equal(sets[2], cells_to_mask(scores, 7, "bottom"))
    with pytest.raises(InterpError, match="keys"):
        cells_to_mask(scores, 3, "random")
    with pytest.raises(InterpError, match="order"):
        cells_to_mask(scores, 3, "sideways")


def test_fraction_steps_of_sevenths():
    assert fraction_steps(7) == pytest.approx([k / 7 for k in range(7)])
    with pytest.raises(InterpError, match="steps"):
        fraction_steps(0)


def test_random_control_in_the_study_is_seeded_and_batch_independent(vit):
    x = images(3, seed=5)
    one = masking_study(open_source(model=vit, images=x, batch_size=3), fractions=[0.0, 0.5], seed=1,
                        progress=False)
    again = masking_study(open_source(model=vit, images=x, batch_size=1), fractions=[0.0, 0.5], seed=1,
                          progress=False)
    assert one.orders == ["top", "bottom", "random"] and set(one.curves) == {"top", "bottom", "random"}
    assert one.curves["random"] == again.curves["random"] and one.seed == 1
    assert one.curves["random"]["agreement"][0] == 1.0              # nothing masked at k = 0
    # the random curve is the model on the images masked at the study's seeded keys (zero fill), done by hand
    keys = random_keys(3, tuple(vit.layout.grid), 1)
    cells = cells_to_mask(torch.zeros_like(keys), 98, "random", keys)
    with torch.no_grad():
        plain = vit(x).argmax(-1)
        masked = mask_images(x, cells, torch.zeros(3), (16, 16))
        run = run_hooks(vit, masked, [resid_post(1)], logits=True)
    assert one.curves["random"]["agreement"][1] == pytest.approx(float((run.logits.argmax(-1) == plain).float().mean()))
    norms = run.acts[resid_post(1)][:, run.layout.patch_slice].norm(dim=-1)
    by_hand = float((norms > one.counting_threshold).sum(1).float().mean())
    assert one.curves["random"]["outliers_per_image"][1] == pytest.approx(by_hand)
    other = masking_study(open_source(model=vit, images=x), fractions=[0.0, 0.5], seed=2, orders=("random",),
                          progress=False)
    assert other.curves["random"]["outliers_per_image"][1] != pytest.approx(by_hand)   # another seed, other cells
    assert json.loads(one.to_json())["params"]["seed"] == 1


def test_outliers_follow_the_detection_contract(vit):
    x = images(3, seed=6)
    source = open_source(model=vit, images=x)
    with torch.no_grad():        # block 0's patch norms of the unmasked run, computed here without the study
        run = run_hooks(vit, x, [resid_post(0)])
        norms = run.acts[resid_post(0)][:, run.layout.patch_slice].norm(dim=-1)
    value = float(norms.flatten().quantile(0.9))
    result = masking_study(source, detection=DetectionSpec(threshold=value, detect_layer=0), fractions=[0.0],
                           orders=("top",), progress=False)
    assert result.detect_layer == 0 and result.threshold == pytest.approx(value)
    assert result.threshold_method == "fixed" and result.counting_threshold == pytest.approx(value)
    per_image = float((norms > value).sum(1).float().mean())
    assert result.unmasked["outliers_per_image"] == pytest.approx(per_image)
    assert result.curves["top"]["outliers_per_image"][0] == pytest.approx(per_image)
    assert result.params["threshold"] == pytest.approx(value) and result.params["detect_layer"] == 0
    # default: p98 at the last block, as before the contract
    default = masking_study(source, fractions=[0.0], orders=("top",), progress=False)
    assert default.detect_layer == 1 and default.threshold_method == "percentile"
    assert default.params["threshold"] == "p98"
    # a preset fills in the threshold and the block; a Detection made once is used as it is
    darcet = masking_study(source, detection=DetectionSpec(preset="darcet"), fractions=[0.0], orders=("top",),
                           progress=False)
    assert darcet.preset == "darcet" and darcet.threshold == 150.0 and darcet.detect_layer == 1
    found = detect(source, DetectionSpec(threshold="p90", detect_layer=0))
    shared = masking_study(source, fractions=[0.0], detection=found, orders=("top",), progress=False)
    assert shared.threshold == pytest.approx(found.threshold.value) and shared.detect_layer == 0
    with pytest.raises(InterpError, match="give the detection once"):  # a config's spec and a Detection
        masking_study(source, MaskingConfig(detection=DetectionSpec(detect_layer=1)), fractions=[0.0],
                      detection=found, progress=False)
    plain = masking_study(source, detection=DetectionSpec(detect_layer=0), fractions=[0.0], orders="top",
                          progress=False)  # a DetectionSpec means what it says: "auto" without a threshold
    assert plain.params["threshold"] == "auto" and plain.orders == ["top"]
    with pytest.raises(InterpError, match="at least one"):
        masking_study(source, fractions=[0.0], orders=(), progress=False)
    with pytest.raises(InterpError, match="belongs to the detection"):
        masking_study(source, fractions=[0.0], threshold=1.0, progress=False)


def test_old_results_load_and_cli_options(tmp_path):
    old = {"study": "masking", "model": "m", "fingerprint": "f", "params": {}, "seed": None,
           "outlier_threshold": 12.5, "outlier_rule": "p98"}
    assert MaskingResult.from_dict(old).counting_threshold == 12.5
    from interp.cli import main
    from interp.models import sample_image_paths

    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["study", "masking", "planted_vit", "--images", str(sample_image_paths()[0]), "--steps", "7",
                     "--threshold", "p90", "--detect-layer", "-1", "--seed", "2", "--out", str(out),
                     "--no-progress"]) == 0
    data = json.loads((out / "masking.json").read_text())
    assert data["fractions"] == pytest.approx([k / 7 for k in range(7)])
    assert data["n_masked"] == [round(k * data["n_patches"] / 7) for k in range(7)]
    assert data["params"]["threshold"] == "p90" and data["threshold_method"] == "percentile"
    assert set(data["curves"]) == {"top", "bottom", "random"} and data["seed"] == 2
    assert (out / "masking_curves.png").exists()
    assert main(["study", "masking", "planted_vit", "--images", str(sample_image_paths()[0]), "--steps", "7",
                 "--fractions", "0", "0.5", "--out", str(tmp_path / "o2"), "--no-progress"]) == 2
