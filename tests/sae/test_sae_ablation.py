"""SAEFeatureAblation against its definition, composed with other interventions, and exported as a patch."""
from __future__ import annotations

import pytest
import torch

import interp
from interp.interventions import NeuronAblation, SAEFeatureAblation, TestTimeRegister
from interp.interventions.base import EditContext
from interp.models import planted_vit
from sae_helpers import HOOK, needs_overcomplete, planted_cache, planted_images, planted_model, planted_sae

pytestmark = needs_overcomplete
FEATURES = [0, 5, 17]


@pytest.fixture(scope="module")
def sae():
    return interp.sae.load(planted_sae(), model=planted_model())


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_edit_is_the_definition(sae, mode):
    """x -> x - sum_f (a_f(x) - m_f) d_f on every token: the SAE's error x - x_hat is kept."""
    x = torch.from_numpy(interp.cache.open(planted_cache())[HOOK][:3])  # [3, T, d]
    ablation = SAEFeatureAblation(sae, FEATURES, mode=mode, tokens="all")
    ctx = EditContext(base_prefix=1, n_prefix=1, extra_start=None, n_layers=6, d_mlp=768)
    edited = ablation.resid_edits(ctx)[3](x)
    codes = sae.encode(x)
    m = sae.tensors["feature_means"][FEATURES] if mode == "mean" else torch.zeros(len(FEATURES))
    expected = x - (codes[..., FEATURES] - m) @ sae.directions[FEATURES]
    assert torch.allclose(edited, expected, atol=1e-3, rtol=1e-5)
    replaced = codes.clone()
    replaced[..., FEATURES] = m
    assert torch.allclose(edited - sae.decode(replaced), x - sae.decode(codes), atol=1e-2)  # same error
    patches_only = SAEFeatureAblation(sae, FEATURES, mode=mode).resid_edits(ctx)[3](x)
    assert torch.equal(patches_only[:, 0], x[:, 0]) and torch.allclose(patches_only[:, 1:], expected[:, 1:], atol=1e-3)


def test_composes_with_other_edits_and_exports_as_a_patch(sae, tmp_path, one_thread):
    model = planted_model()
    images = planted_images(2, seed=7)
    edits = [TestTimeRegister({2: [17, 101]}), SAEFeatureAblation(sae, FEATURES), NeuronAblation({4: [3]})]
    with torch.no_grad():
        plain_logits = model(images)
        hooked = model.run_with_interventions(images, edits)
        path = interp.patch.save(edits, tmp_path / "sae.safetensors", model)
        loaded = interp.patch.load(path)
        assert [iv.kind for iv in loaded] == ["TestTimeRegister", "SAEFeatureAblation", "NeuronAblation"]
        patched = interp.patch.apply(planted_vit(), path)(images)
        again = model.run_with_interventions(images, loaded)
    assert not torch.allclose(hooked, plain_logits, atol=1e-4)
    assert torch.allclose(patched, hooked, atol=1e-4) and torch.allclose(again, hooked, atol=1e-5)


def test_bad_features_are_refused(sae):
    with pytest.raises(ValueError, match="does not exist"):
        SAEFeatureAblation(sae, [sae.n_features])
    with pytest.raises(ValueError, match="distinct"):
        SAEFeatureAblation(sae, [1, 1])
    with pytest.raises(ValueError, match="mode"):
        SAEFeatureAblation(sae, [1], mode="shuffle")


def test_resample_puts_another_images_codes_in_place_of_the_features():
    """x_i -> x_i - sum_f (a_f(x_i) - a_f(x_j)) d_f, with j != i another image of the batch (the same token)."""
    sae = interp.sae.load(planted_sae(), model=planted_model())
    x = torch.from_numpy(interp.cache.open(planted_cache())[HOOK][:2])  # [2, T, d]: the derangement is a swap
    codes = sae.encode(x)
    features = (codes[0] - codes[1]).abs().sum(0).topk(3).indices.tolist()  # firing differently on the two images
    ctx = EditContext(base_prefix=1, n_prefix=1, extra_start=None, n_layers=6, d_mlp=768)
    edited = SAEFeatureAblation(sae, features, mode="resample", tokens="all", seed=3).resid_edits(ctx)[3](x)
    a = codes[..., features]
    expected = x - (a - a.flip(0)) @ sae.directions[features]
    assert torch.allclose(edited, expected, atol=1e-3, rtol=1e-5)
    assert not torch.allclose(edited, x - a @ sae.directions[features], atol=1e-2)  # not the zero ablation


@pytest.mark.parametrize("tokens", ["cls", "registers", "patches", "all"])
def test_the_ablation_edits_the_token_kind_the_sae_was_trained_on(sae, tokens):
    """An SAE trained on the CLS token (or the registers) is ablated there, nowhere else; by default the kind
    is the SAE's own (sae.json's tokens). Layout [CLS, 2 registers, patches]."""
    x = torch.from_numpy(interp.cache.open(planted_cache())[HOOK][:2])  # [2, T, d]
    x = torch.cat([x[:, 5:6], x[:, 7:9], x[:, 1:]], dim=1)  # patch rows standing in for the CLS and 2 registers
    codes = sae.encode(x)
    features = sorted({int(f) for f in codes[:, :3].reshape(-1, sae.n_features).argmax(-1)})  # fire on all rows
    trained = SAEFeatureAblation(sae, features, tokens=tokens, prefix={"cls_index": 0, "n_registers": 2})
    ctx = EditContext(base_prefix=3, n_prefix=3, extra_start=None, n_layers=6, d_mlp=768)
    edited = trained.resid_edits(ctx)[3](x)
    rows = {"cls": [0], "registers": [1, 2], "patches": list(range(3, x.shape[1])),
            "all": list(range(x.shape[1]))}[tokens]
    expected = x - codes[..., features] @ sae.directions[features]
    others = [r for r in range(x.shape[1]) if r not in rows]
    assert torch.allclose(edited[:, rows], expected[:, rows], atol=1e-3)
    assert torch.equal(edited[:, others], x[:, others])
    assert not torch.allclose(edited[:, rows], x[:, rows], atol=1e-4)


def test_default_token_kind_is_the_sae_s_and_survives_a_patch_file(sae, tmp_path, monkeypatch):
    monkeypatch.setitem(sae.config, "tokens", "cls")
    ablation = SAEFeatureAblation(sae, FEATURES)
    assert ablation.tokens == "cls" and ablation.prefix == {"cls_index": 0, "n_registers": 0}
    path = interp.patch.save([ablation], tmp_path / "cls.safetensors", planted_model())
    (loaded,) = interp.patch.load(path)
    assert loaded.tokens == "cls" and loaded.prefix == ablation.prefix
    monkeypatch.setitem(sae.config, "tokens", "registers")
    with pytest.raises(interp.errors.InterpError, match="no register tokens"):
        SAEFeatureAblation(sae, FEATURES)


def test_patch_export_builds_an_sae_feature_ablation_from_sae_features_json(sae, tmp_path, capsys, one_thread):
    """`interp patch export --sae DIR --features sae_features.json` writes the ablation of the artifact subspace;
    `interp patch apply` then matches the hooked model; ids work too; the pair is required together."""
    import json

    from interp.cli import main

    report = tmp_path / "sae_features.json"
    report.write_text(json.dumps({"artifact_subspace": {"features": FEATURES[:2]},
                                  "artifact_features": [{"feature": 99}]}))
    out = tmp_path / "sae-patch.safetensors"
    assert main(["patch", "export", "planted_vit", "--sae", str(planted_sae()), "--features", str(report),
                 "--out", str(out)]) == 0, capsys.readouterr().err
    (loaded,) = interp.patch.load(out)
    assert loaded.kind == "SAEFeatureAblation" and loaded.features == FEATURES[:2] and loaded.tokens == "patches"
    assert main(["patch", "apply", "planted_vit", str(out)]) == 0
    capsys.readouterr()
    assert main(["patch", "export", "planted_vit", "--sae", str(planted_sae()), "--features", "0,5",
                 "--sae-mode", "mean", "--out", str(tmp_path / "ids.safetensors")]) == 0
    assert interp.patch.load(tmp_path / "ids.safetensors")[0].mode == "mean"
    capsys.readouterr()
    assert main(["patch", "export", "planted_vit", "--sae", str(planted_sae()), "--out", str(tmp_path / "x")]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["patch", "export", "planted_vit", "--out", str(tmp_path / "x")]) == 2
    assert "--interventions" in capsys.readouterr().err


def test_features_take_ids_or_a_sae_features_json(tmp_path):
    import argparse
    import json

    from interp.values import sae_feature_ids

    assert sae_feature_ids("12,40") == (12, 40)
    path = tmp_path / "sae_features.json"
    path.write_text(json.dumps({"artifact_subspace": None, "artifact_features": [{"feature": 7}, {"feature": 3}]}))
    assert sae_feature_ids(str(path)) == (7, 3)
    path.write_text(json.dumps({"artifact_subspace": {"features": []}, "artifact_features": []}))
    with pytest.raises(argparse.ArgumentTypeError, match="lists none"):
        sae_feature_ids(str(path))
    with pytest.raises(argparse.ArgumentTypeError, match="readable"):
        sae_feature_ids(str(tmp_path / "missing.json"))
