"""``interp study ablate --sae DIR --features F,...``: removing the planted artifact feature removes the outliers,
random live features off the high-norm tokens remove none, with the records of the neuron ablation; the options'
refusals. Reuses the SAE of tests/sae_helpers.py."""
from __future__ import annotations

import json

import interp
from interp.cli import main
from interp.runtime.open import open_source
from interp.studies import sae_features_study
from sae_helpers import HOOK, needs_overcomplete, planted_cache, planted_model, planted_sae


@needs_overcomplete
def test_ablating_the_artifact_feature_against_random_live_features(tmp_path, capsys, one_thread):
    cache_run = sae_features_study(open_source(cache=planted_cache(), model=planted_model()), sae=str(planted_sae()),
                                   progress=False)
    features = ",".join(str(f["feature"]) for f in cache_run.artifact_features)
    photos = str(interp.models.sample_image_paths()[0].parent)
    out = tmp_path / "ablate"
    assert main(["study", "ablate", "planted_vit", "--images", photos, "--sae", str(planted_sae()), "--features",
                 features, "--controls", "3", "--out", str(out), "--no-progress"]) == 0
    data = json.loads((out / "ablate.json").read_text())
    counts = {name: c["outlier_count"] for name, c in data["conditions"].items()}
    assert counts["baseline"] > 0 and counts["target"] <= 0.1 * counts["baseline"]  # >= 90 % removed
    controls = [counts[f"control_{i}"] for i in range(3)]
    assert all(c >= 0.9 * counts["baseline"] for c in controls)  # random live features: almost none removed
    assert data["features"] == [int(f) for f in features.split(",")] and data["hook"] == HOOK
    chosen = set(data["features"])
    assert all(len(c["features"]) == len(chosen) and not chosen & set(c["features"]) for c in data["controls"])
    assert data["neurons"] == {} and data["params"]["sae"] == str(planted_sae())
    assert list(data["replacements"]) == ["zero", "mean", "resample"]  # each against its own controls
    for r in ("mean", "resample"):
        removed = data["replacements"][r]["comparison"]["removed"]
        assert len(removed["controls"]) == 3 and removed["target"] is not None
    capsys.readouterr()
    base = ["study", "ablate", "planted_vit", "--images", photos, "--out", str(tmp_path / "o")]
    assert main(base + ["--sae", str(planted_sae()), "--features", features, "--neurons", "2:17"]) == 2
    assert "alternatives" in capsys.readouterr().err
    assert main(base + ["--sae", str(planted_sae())]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(base + ["--sae", str(planted_sae()), "--features", "12,x"]) == 2
    assert main(base) == 1 and "--sae DIR --features" in capsys.readouterr().err
    assert main(base + ["--sae", str(planted_sae()), "--features", "99999"]) == 2  # a bad value, said before torch
    assert "feature 99999 does not exist" in capsys.readouterr().err
