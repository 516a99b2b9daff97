"""Controls that can fail (docs/sae.md "Ablation against random features"): on the planted model, removing the
artifact subspace removes the outliers while random feature sets matched to it by firing rate and by firing on the
high-norm tokens do not; with targets that are not special (a matched random set), the comparison says so; a
feature along the artifact direction is never a control."""
from __future__ import annotations

import json

import pytest

import interp
from interp.cli import main
from interp.sae.controls import ALIGNED_COS, aligned_features, matched_controls
from sae_helpers import needs_overcomplete, planted_cache, planted_model, planted_sae_wide

pytestmark = needs_overcomplete


@pytest.fixture(scope="module")
def wide():
    from interp.sae.features import sae_features

    model = planted_model()
    return sae_features(interp.sae.load(planted_sae_wide(), model=model), model, cache=planted_cache())


def _ablate(features, out):
    photos = str(interp.models.sample_image_paths()[0].parent)
    assert main(["study", "ablate", "planted_vit", "--images", photos, "--sae", str(planted_sae_wide()),
                 "--features", ",".join(map(str, features)), "--controls", "3", "--out", str(out),
                 "--no-progress"]) == 0
    return json.loads((out / "ablate.json").read_text())


def _removed(data, name):
    counts = data["conditions"]
    return 1 - counts[name]["outlier_count"] / counts["baseline"]["outlier_count"]


def test_the_subspace_removes_the_outliers_matched_controls_do_not(wide, tmp_path, one_thread):
    subspace = wide["artifact_subspace"]["features"]
    assert wide["artifact_subspace"]["coverage"] >= 0.8
    data = _ablate(subspace, tmp_path / "subspace")
    pool = data["control_pool"]
    assert data["conditions"]["baseline"]["outlier_count"] > 50
    assert _removed(data, "target") >= 0.9
    assert all(_removed(data, f"control_{i}") <= 0.2 for i in range(3))
    # matched: every control feature fires on the high-norm tokens as its target does, none is the artifact's
    assert all(pool["matched"]) and pool["note"] is None
    for rates in pool["control_high_norm_rates"]:
        assert min(rates) >= min(pool["target_high_norm_rates"]) - 0.25
    by_id = {f["feature"]: f for f in wide["features"]}
    assert all(by_id[f]["cos_excess"] < ALIGNED_COS for c in data["controls"] for f in c["features"])
    assert data["comparison"]["target_beyond_controls"] is True


def test_targets_that_are_not_special_are_said_so(wide, tmp_path, one_thread):
    """Targets drawn as a matched random set (they fire on every high-norm token, outside the artifact): they
    remove about as little as their own controls, and the result says they are not special."""
    (targets,), _ = matched_controls(wide, wide["artifact_subspace"]["features"], 1, seed=0)
    data = _ablate(targets, tmp_path / "random")
    assert _removed(data, "target") <= 0.2
    assert data["comparison"]["target_beyond_controls"] is False
    assert any("not special" in note for note in data["notes"])


def test_a_feature_along_the_artifact_direction_is_never_a_control():
    """Outside the subspace, a feature writing along the artifact (cos_excess >= ALIGNED_COS) that fires exactly
    like the target would be its nearest match: it is excluded, and the enriched feature pointing elsewhere is
    drawn instead."""
    rates = lambda high, normal: {"normal_patch": normal, "high_norm": high, "cls": None, "register": None}
    features = [{"feature": 0, "alive": True, "rates": rates(1.0, 0.0), "cos_excess": 0.9},  # target
                {"feature": 1, "alive": True, "rates": rates(1.0, 0.0), "cos_excess": 0.8},  # the artifact again
                {"feature": 2, "alive": True, "rates": rates(0.9, 0.0), "cos_excess": 0.1},  # fires there, elsewhere
                {"feature": 3, "alive": True, "rates": rates(0.0, 0.5), "cos_excess": -0.2}]
    report = {"features": features, "n_alive": 4, "analysed_kinds": ["normal_patch", "high_norm"],
              "n_tokens": {"normal_patch": 900, "high_norm": 100, "cls": 0, "register": 0},
              "artifact_subspace": {"features": [0]}}
    assert aligned_features(report) == [0, 1]
    controls, matched = matched_controls(report, [0], 4, seed=0)
    assert all(c == [2] for c in controls) and all(matched)
