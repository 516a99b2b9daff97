"""The corrupted runs of patching (interp/studies/causal/corruptions.py): another image, noise, a region filled
with the mean colour or blurred (one box, a box file, mask files), the trained registers zeroed and a test-time
register present vs absent; and the metric read through a classifier file, by patching and attribution alike."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import interp
from conftest import REPO, images, make_model
from interp.detection.spec import DetectionSpec
from interp.errors import InterpError
from interp.interventions.token_replacement import TokenReplacement, token_rows
from interp.models.classifiers.classifier import save_classifier
from interp.runtime.forward import run_hooks
from interp.runtime.open import open_source
from interp.studies.causal.attribution import attribution_study
from interp.studies.causal.configs import PatchingConfig
from interp.studies.causal.corruptions import make_corruption
from interp.studies.causal.patching import patching_study
from interp.studies.core.pixels import gaussian_blur

SAMPLES = REPO / "interp" / "data" / "samples"
TWO = [SAMPLES / "astronaut.jpg", SAMPLES / "chelsea.jpg"]  # 256 x 256 and 385 x 256


@pytest.fixture(scope="module")
def small():
    return open_source(model=make_model("vit", img_size=32), images=images(3, size=32))


def test_image_noise_and_box(small):
    x = images(3, size=32)
    runs = make_corruption(small, PatchingConfig(corruption="image")).runs(x, 0)
    assert torch.equal(runs.corrupted, x[[1, 2, 0]]) and runs.clean is x and runs.corrupted_edits == ()
    with pytest.raises(InterpError, match="a batch of one image"):
        make_corruption(small, PatchingConfig(corruption="image")).runs(x[:1], 0)
    noisy = make_corruption(small, PatchingConfig(corruption="noise", noise=2.0, seed=1))
    first, again = noisy.runs(x, 4).corrupted, noisy.runs(x, 4).corrupted
    assert torch.equal(first, again) and not torch.equal(first, noisy.runs(x, 7).corrupted)
    assert (first - x).std().item() == pytest.approx(2.0, rel=0.1)
    boxed = make_corruption(small, PatchingConfig(corruption="region", box=(4, 8, 20, 16))).runs(x, 0).corrupted
    assert boxed[..., 8:16, 4:20].abs().sum() == 0 and torch.equal(boxed[..., 16:, :], x[..., 16:, :])
    blurred = make_corruption(small, PatchingConfig(corruption="region", box=(4, 8, 20, 16), fill="blur",
                                                    blur_sigma=2.0)).runs(x, 0).corrupted
    assert torch.equal(blurred[..., 8:16, 4:20], gaussian_blur(x, 2.0)[..., 8:16, 4:20])
    assert torch.equal(blurred[..., :8, :], x[..., :8, :]) and torch.equal(blurred[..., :4], x[..., :4])
    with pytest.raises(InterpError, match="reaches past"):
        make_corruption(small, PatchingConfig(corruption="region", box=(0, 0, 40, 8)))


@pytest.fixture(scope="module")
def photos():
    """planted_vit at 64 px on two sample photos (files: box and mask files name them)."""
    return open_source(model=interp.load("planted_vit", img_size=64), images=TWO)


def test_regions_from_box_and_mask_files(photos, tmp_path):
    (tmp_path / "boxes.csv").write_text("image,x0,y0,x1,y1\nastronaut.jpg,0,0,128,256\nchelsea.jpg,0,0,385,256\n")
    boxes = make_corruption(photos, PatchingConfig(corruption="region", boxes=str(tmp_path / "boxes.csv"))).region
    assert boxes.shape == (2, 64, 64) and bool(boxes[1].all())  # chelsea's box covers the centre crop
    assert bool(boxes[0, :, :32].all()) and not bool(boxes[0, :, 32:].any())  # astronaut's left half
    masks = tmp_path / "masks"
    masks.mkdir()
    left = np.zeros((256, 256), dtype=np.uint8)
    left[:, :128] = 255
    Image.fromarray(left).save(masks / "astronaut.png")
    Image.fromarray(np.full((256, 385), 255, dtype=np.uint8)).save(masks / "chelsea.png")
    config = PatchingConfig(corruption="region", masks=str(masks), fill="blur")
    assert torch.equal(make_corruption(photos, config).region, boxes)
    result = patching_study(photos, config, site="z", blocks=(1,), progress=False)
    assert result.clean == pytest.approx(1.0) and result.corrupted < 1.0 and result.params["masks"] == str(masks)
    (masks / "chelsea.png").unlink()
    with pytest.raises(InterpError, match="1 image.*no region.*chelsea"):
        make_corruption(photos, config)


def test_trained_registers_zeroed():
    model = make_model("dinov2_reg", img_size=56)
    x = images(2, size=56)
    source = open_source(model=model, images=x)
    result = patching_study(source, site="resid_post", corruption="registers", progress=False)
    zeroed = TokenReplacement(token_rows(model.layout, "registers"), "zero")
    clean, bad = run_hooks(model, x, logits=True), run_hooks(model, x, interventions=[zeroed], logits=True)
    cosine = torch.nn.functional.cosine_similarity(bad.pooled, clean.pooled, dim=-1).mean()
    assert result.clean == pytest.approx(1.0) and result.corrupted == pytest.approx(float(cosine), abs=1e-5)
    # The pooled vector is the CLS row of the last block: patching it restores the clean run, nothing else does.
    last = torch.tensor(result.normalized[-1])
    assert last[0] == pytest.approx(1.0, abs=1e-4) and last[1:].abs().max() < 1e-4
    with pytest.raises(InterpError, match="has none"):
        patching_study(open_source(model=make_model("vit", img_size=32), images=images(2, size=32)),
                       corruption="registers", progress=False)


@pytest.fixture(scope="module")
def planted():
    """planted_vit at 64 px, two noise images with one flat patch each: one artifact per image (test_patching)."""
    model = interp.load("planted_vit", img_size=64)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    x[0, :, 16:32, 16:32] = 0.3
    x[1, :, 32:48, 48:64] = -0.2
    return open_source(model=model, images=x, batch_size=2)


def test_test_time_register_present_vs_absent(planted):
    neurons = "2:17,2:101,2:402,2:655"
    kw = dict(detection=DetectionSpec(threshold=300.0), site="mlp_out", blocks=(2,), metric="outliers",
              corruption="test-time-register", register_neurons=neurons, cells=17, progress=False)
    result = patching_study(planted, **kw)
    assert result.clean == 0.0 and result.corrupted == 1.0  # the register takes the artifacts; without, one each
    # Denoising into the run without the register: block 2's MLP output at the flat patches carries what it adds.
    effect = torch.tensor(result.normalized[0])
    assert effect.nonzero().flatten().tolist() == [6, 12] and torch.allclose(effect[[6, 12]], torch.tensor(0.5))
    assert len(result.cells[0]) == 17 and len(result.attention[0]) == 17  # the clean CLS row on the shared tokens
    # Noising: the run with the register (one more token) is patched; its own token has no counterpart.
    noised = patching_study(planted, **{**kw, "direction": "noise"})
    assert len(noised.cells[0]) == 18 and noised.cells[0][1] == "prefix 1" and noised.values[0][1] == 0.0
    assert noised.normalized[0][7] == 0.5 and noised.normalized[0][13] == 0.5  # the flat patches, one row later
    assert any("test-time register's token" in note for note in noised.notes)
    assert len(noised.attention[0]) == 18 and sum(noised.attention[0]) == pytest.approx(1.0, abs=1e-5)


def test_metric_through_a_classifier_file(planted, tmp_path):
    g = torch.Generator().manual_seed(3)
    linear = save_classifier(tmp_path / "linear.pt", "linear", torch.randn(3, 192, generator=g),
                             torch.randn(3, generator=g))
    kw = dict(site="z", metric="logit-diff", classes=(0, 2), corruption="noise", noise=0.5, progress=False)
    result = patching_study(planted, classifier=str(linear), **kw)
    w = torch.load(linear, weights_only=True)
    x = torch.cat([b for _, b in planted.image_batches()])
    run = run_hooks(planted.model, x, logits=True)
    logits = run.pooled @ w["weight"].T + w["bias"]
    assert result.clean == pytest.approx(float((logits[:, 0] - logits[:, 2]).mean()), abs=1e-4)
    assert result.params["classifier"]["kind"] == "linear" and result.params["classifier"]["input"] == "pooled"
    # Attribution's estimate reads the same target: the same clean value, and the heads stay linear in it.
    attributed = attribution_study(planted, classifier=str(linear), **kw)
    assert attributed.clean == pytest.approx(result.clean) and attributed.correlation > 0.99
    # A zero-shot matrix over the head output: the probability of class 1 under its logits.
    rows = torch.nn.functional.normalize(torch.randn(4, 10, generator=g), dim=-1)
    zeroshot = save_classifier(tmp_path / "zs.pt", "zeroshot", rows, logit_scale=10.0)
    prob = patching_study(planted, classifier=str(zeroshot), **{**kw, "metric": "prob", "classes": (1,)})
    expected = (10.0 * torch.nn.functional.normalize(run.logits, dim=-1) @ rows.T).softmax(-1)[:, 1].mean()
    assert prob.clean == pytest.approx(float(expected), abs=1e-5)
    with pytest.raises(InterpError, match="classifier has 3 classes"):
        patching_study(planted, classifier=str(linear), **{**kw, "classes": (0, 5)})
