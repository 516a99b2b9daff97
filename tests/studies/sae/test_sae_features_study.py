"""``interp study sae-features``: the study declared in interp/studies/sae (config, study, figures) finds the
planted artifact feature through the command line, no artifact feature on a random-weight ViT, and refuses an
SAE of another model, hook or width in one line. Reuses the SAE of tests/sae_helpers.py (trained once per run)."""
from __future__ import annotations

import json

import pytest
import torch

import interp
from conftest import make_model
from interp.cache.format import model_fingerprints
from interp.cli import main
from interp.errors import UsageError
from interp.models import planted_truth
from interp.plots import study_figures
from interp.runtime.open import open_source
from interp.sae.model import save as save_sae
from interp.studies import SaeFeaturesResult, sae_features_study
from sae_helpers import HOOK, needs_overcomplete, planted_cache, planted_images, planted_model, planted_sae
from interp.detection.spec import DetectionSpec

RANDOM_HOOK = "blocks.1.hook_resid_post"


def _handmade_sae(out, model, hook, d, n_features=16, seed=0):
    """An SAE folder written without training (random encoder and dictionary): enough for the study's
    bookkeeping and refusals."""
    g = torch.Generator().manual_seed(seed)
    tensors = {"w_enc": torch.randn(n_features, d, generator=g), "b_enc": torch.zeros(n_features),
               "dictionary": torch.nn.functional.normalize(torch.randn(n_features, d, generator=g), dim=1),
               "mean": torch.zeros(d), "scale": torch.ones(1), "feature_means": torch.zeros(n_features)}
    out.mkdir(parents=True, exist_ok=True)
    save_sae(out, {"arch": "topk", "k": 4, "hook": hook, "model": model_fingerprints(model), "tokens": "all"},
             tensors)
    return out


@pytest.fixture(scope="module")
def random_vit(tmp_path_factory):
    """A 2-block random-weight ViT, a cache of its block 1 and a (handmade) SAE of that hook."""
    folder = tmp_path_factory.mktemp("sae_random")
    model = make_model("vit")
    images = torch.randn(6, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    interp.cache.write(model, images, hooks=RANDOM_HOOK, path=folder / "acts.h5", progress=False,
                       dtype="float32")
    return model, folder / "acts.h5", _handmade_sae(folder / "sae", model, RANDOM_HOOK, model.d_model)


@needs_overcomplete
def test_the_planted_artifact_feature_through_the_command_line(tmp_path, capsys, one_thread):
    truth = planted_truth(planted_model())
    neurons = ",".join(f"{truth.layer}:{n}" for n in truth.neurons)
    out = tmp_path / "study"
    assert main(["study", "sae-features", "planted_vit", "--sae", str(planted_sae()), "--cache",
                 str(planted_cache()), "--out", str(out), "--neurons", neurons, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "sae_features.json").read_text())
    assert data["study"] == "sae_features" and data["artifacts_found"] is True and data["hook"] == HOOK
    assert data["detect_layer"] == 3 and data["threshold"] > 0
    assert len(data["features"]) == data["n_features"] and data["n_tokens"]["high_norm"] > 0
    subspace = data["artifact_subspace"]
    assert subspace["cos_register_neurons"]["max"] >= 0.9 and subspace["cos_mean_high_norm"] >= 0.9
    assert subspace["features"] == [f["feature"] for f in data["artifact_features"]] and subspace["coverage"] >= 0.5
    best = max(data["artifact_features"], key=lambda f: f["cos_register_neurons"]["max"])
    assert best["precision"] >= 0.5 and data["tokens"] == "patches"
    assert 0 < len(best["top_patches"]) <= 8 and len(best["maps"]) == 4
    assert len(best["maps"][0]) == data["grid"][0] * data["grid"][1]
    assert sorted(data["figure_files"]) == ["sae_feature_maps.png", "sae_top_patches.png"]
    assert f"feature {best['feature']}: fires on" in printed and "artifact feature(s) of" in printed


@needs_overcomplete
def test_a_live_run_crops_the_top_patches_from_the_images(one_thread):
    model = planted_model()
    truth = planted_truth(model)
    source = open_source(model=model, images=planted_images(6, seed=5), batch_size=6)
    result = sae_features_study(source, sae=str(planted_sae()), neurons={truth.layer: list(truth.neurons)},
                                n_maps=2, progress=False)
    assert isinstance(result, SaeFeaturesResult) and result.artifact_features
    assert result.artifact_subspace["cos_register_neurons"]["max"] >= 0.9
    images = result.figure_images(source)
    assert images is not None and len(images) == result.crop_images() >= 2
    stems = [stem for stem, _ in study_figures(result, images, n_maps=2)]
    assert stems == ["sae_top_patches", "sae_feature_maps"]


def test_a_random_weight_vit_has_no_artifact_features(random_vit, capsys):
    model, cache, sae = random_vit
    result = sae_features_study(open_source(cache=cache, model=model), sae=str(sae), progress=False)
    assert result.artifacts_found is False and result.artifact_features == []
    assert result.n_tokens["high_norm"] == 0 and len(result.features) == 16
    lines = result.console_lines()
    assert len(lines) == 1 and lines[0].startswith("no artifacts at blocks.1.hook_resid_post")
    (stem, fig), (stem2, fig2) = study_figures(result)
    assert "no artifact features" in [t.get_text() for t in fig.axes[0].texts]


def test_refusals_name_the_fix(random_vit, tmp_path, capsys):
    model, cache, sae = random_vit
    source = open_source(cache=cache, model=model)
    other = make_model("vit", seed=1)  # the same architecture, other weights
    with pytest.raises(interp.InterpError, match="trained on model .* other weights"):
        sae_features_study(source, sae=str(_handmade_sae(tmp_path / "other", other, RANDOM_HOOK, other.d_model)),
                           progress=False)
    with pytest.raises(interp.InterpError, match="lacks|does not provide"):
        sae_features_study(source, sae=str(_handmade_sae(tmp_path / "hook", model, "blocks.0.hook_resid_post",
                                                          model.d_model)), progress=False)
    with pytest.raises(interp.InterpError, match="width 8"):
        sae_features_study(source, sae=str(_handmade_sae(tmp_path / "width", model, RANDOM_HOOK, 8)),
                           progress=False)
    with pytest.raises(interp.InterpError, match="trained on weights"):  # a cache opened without the model
        sae_features_study(open_source(cache=planted_cache()), sae=str(sae), progress=False)
    without_model = sae_features_study(open_source(cache=cache), sae=str(sae), progress=False)
    assert without_model.n_tokens == sae_features_study(source, sae=str(sae), progress=False).n_tokens
    with pytest.raises(interp.InterpError, match="fc2 columns"):
        sae_features_study(open_source(cache=cache), sae=str(sae), neurons="0:1", progress=False)
    with pytest.raises(UsageError, match="SAE's own hook"):
        sae_features_study(source, detection=DetectionSpec(detect_layer=0), sae=str(sae), progress=False)
    with pytest.raises(UsageError, match="needs --sae"):
        sae_features_study(source, progress=False)
    capsys.readouterr()
    out = str(tmp_path / "o")
    assert main(["study", "sae-features", "planted_vit", "--cache", str(cache), "--out", out]) == 2
    assert "needs --sae" in capsys.readouterr().err
    assert main(["study", "sae-features", "planted_vit", "--sae", str(tmp_path), "--cache", str(cache),
                 "--out", out]) == 2
    err = capsys.readouterr().err
    assert "no sae.json there" in err and err.count("\n") == 1
