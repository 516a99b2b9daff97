"""SAEs of SAELens, saev and ViT-Prisma (fixtures written as those projects write them, tests/reference/
foreign_sae.py) imported with `interp sae import`: the same codes and reconstructions as the projects' own
forward passes, then sae-features and an ablation patch on each."""
from __future__ import annotations

import json
import re

import pytest
import torch

import interp
from interp.cli import main
from interp.errors import InterpError, UsageError
from interp.sae import foreign
from interp.sae.features import sae_features
from interp.sae.model import save
from reference import foreign_sae as ref
from reference import saev_batchtopk as saev_ref
from sae_helpers import HOOK, planted_cache, planted_model

D, N = 192, 384


def _cases(tmp_path):
    w_relu, w_jump = ref.random_weights(D, N, 1), ref.random_weights(D, N, 2, threshold=True)
    return [
        ("saelens", ref.write_saelens(tmp_path / "sl_std", w_relu, "standard", HOOK), w_relu, "relu", True, None),
        ("saelens", ref.write_saelens(tmp_path / "sl_topk", w_relu, "topk", HOOK, k=8), w_relu, "topk", True, None),
        ("saelens", ref.write_saelens(tmp_path / "sl_jump", w_jump, "jumprelu", HOOK), w_jump, "jumprelu", True, None),
        ("saelens", ref.write_saelens(tmp_path / "sl_nob", w_relu, "standard", HOOK, apply_b_dec_to_input=False),
         w_relu, "relu", False, None),
        ("saev", ref.write_saev(tmp_path / "saev" / "sae.pt", w_relu, "TopK", 8), w_relu, "topk", False, HOOK),
        ("saev", ref.write_saev(tmp_path / "saev2" / "sae.pt", w_relu), w_relu, "relu", False, HOOK),
        ("vit_prisma", ref.write_vit_prisma(tmp_path / "prisma", w_relu, 3, "topk", 8), w_relu, "topk", True, None),
    ]


def test_imported_saes_encode_and_decode_as_their_projects_do(tmp_path, capsys):
    x = torch.from_numpy(interp.cache.open(planted_cache())[HOOK][:2]).reshape(-1, D)
    for i, (fmt, source, w, kind, subtract, hook) in enumerate(_cases(tmp_path)):
        out = tmp_path / f"imported{i}"
        args = ["sae", "import", "planted_vit", fmt, str(source), "--out", str(out)] + (["--hook", hook] if hook else [])
        assert main(args) == 0, capsys.readouterr().err
        sae = interp.sae.load(out, model=planted_model(), hook=HOOK)
        codes, recon = ref.forward(w, x, kind, subtract)
        assert torch.allclose(sae.encode(x), codes, atol=1e-4), (fmt, kind)
        assert torch.allclose(sae.decode(sae.encode(x)), recon, atol=1e-3), (fmt, kind)
        assert sae.config["imported_from"]["format"] == fmt


def test_sae_features_and_a_patch_run_on_each_format(tmp_path, capsys, one_thread):
    model = planted_model()
    for i, (fmt, source, w, kind, subtract, hook) in enumerate(_cases(tmp_path)[::3]):
        out = tmp_path / f"imp{i}"
        args = ["sae", "import", "planted_vit", fmt, str(source), "--out", str(out)] + (["--hook", hook] if hook else [])
        assert main(args) == 0, capsys.readouterr().err
        report = sae_features(interp.sae.load(out, model=model), model, cache=planted_cache())
        assert report["artifacts_found"] and len(report["features"]) == N and report["tokens"] == "patches"
        alive = [f["feature"] for f in report["features"] if f["alive"]][:2]
        assert main(["patch", "export", "planted_vit", "--sae", str(out), "--features", ",".join(map(str, alive)),
                     "--out", str(tmp_path / f"p{i}.safetensors")]) == 0, capsys.readouterr().err


def test_refusals_are_one_line(tmp_path, capsys):
    w = ref.random_weights(D, N)
    saev = ref.write_saev(tmp_path / "s" / "sae.pt", w)
    assert main(["sae", "import", "planted_vit", "saev", str(saev), "--out", str(tmp_path / "o")]) == 1
    assert "--hook" in capsys.readouterr().err
    folder = ref.write_saelens(tmp_path / "n", w, "standard", HOOK)
    cfg = json.loads((folder / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps({**cfg, "normalize_activations": "expected_average_only_in"}))
    with pytest.raises(InterpError, match="normalize_activations"):
        foreign.convert("saelens", folder, planted_model())
    narrow = ref.write_saelens(tmp_path / "w", ref.random_weights(64, 128), "standard", HOOK)
    with pytest.raises(InterpError, match="width 64"):
        foreign.convert("saelens", narrow, planted_model())


# ------------------------------------------------------------------ saev's current files (schema 5, Nov 2025 on)
def _threshold_in_a_gap(h: torch.Tensor, mean_l0: float) -> float:
    """A threshold that keeps about ``mean_l0`` pre-activations per token, in the middle of the widest gap
    between neighbouring values near there: no value lies within float error of it."""
    values = h.flatten().sort().values
    at = len(values) - int(mean_l0 * h.shape[0])
    window = values[at - 200:at + 200]
    i = int((window[1:] - window[:-1]).argmax())
    assert float(window[i + 1] - window[i]) > 1e-4
    return float(window[i] + window[i + 1]) / 2


def test_saev_batchtopk_keeps_every_code_above_its_inference_threshold(tmp_path):
    """Issue 47 #5: saev's BatchTopK keeps, in eval, every pre-activation above ``activation.threshold`` (not a
    per-token top-k): the imported SAE gives saev's eval codes and reconstruction (tests/reference/
    saev_batchtopk.py), with as many codes per token as the threshold passes (a per-token top-k would not)."""
    w = ref.random_weights(D, N, 3)
    x = torch.from_numpy(interp.cache.open(planted_cache())[HOOK][:2]).reshape(-1, D)
    h = x @ w["W_enc"] + w["b_enc"]
    model = planted_model()
    for i, threshold in enumerate((_threshold_in_a_gap(h, 14.0), 0.0)):
        source = saev_ref.write_saev(tmp_path / f"s{i}.pt", w, "BatchTopK", top_k=8, threshold=threshold)
        config, tensors = foreign.convert("saev", source, model, hook=HOOK)
        (tmp_path / f"o{i}").mkdir()
        sae = interp.sae.load(save(tmp_path / f"o{i}", config, tensors), model=model)
        codes, recon = saev_ref.eval_forward(w, x, "BatchTopK", 8, threshold)
        assert torch.allclose(sae.encode(x), codes, atol=1e-4), threshold
        assert torch.allclose(sae.decode(sae.encode(x)), recon, atol=1e-3), threshold
        per_token = (codes > 0).sum(1).float()
        assert per_token.std() > 1 and abs(per_token.mean() - (14 if threshold else (h > 0).sum(1).float().mean())) < 1
        assert not torch.allclose(ref.forward(w, x, "topk", False, k=8)[0], codes, atol=1e-2)  # the old reading
        assert sae.config["arch"] == "batchtopk" and sae.k == 8


@pytest.mark.parametrize("edit, words", [
    (dict(schema=6), "saev schema 6; this interp reads schemas 2-5"),
    (dict(schema=None), "saev schema null"),
    (dict(schema=True), "saev schema true"),
    (dict(threshold=None), "a BatchTopK without activation.threshold"),
    (dict(header_edits={"cfg": {"activation": "TopK"}}), 'activation is "TopK", not an object'),
    (dict(header_edits={"cfg": {"activation": {"cls": "TopK", "params": {"top_k": "8"}}}}), 'top_k is "8"'),
    (dict(header_edits={"cfg": {"activation": {"cls": "Matryoshka", "params": {}}}}), "activation 'Matryoshka'"),
    (dict(activation="TopK", threshold=0.5), "tensor(s) ['activation.threshold'] that a saev TopK does not hold"),
])
def test_saev_files_the_importer_does_not_know_are_refused_in_one_line(tmp_path, edit, words):
    """An unknown schema, a BatchTopK without its inference threshold, an activation given as a string (it
    imported as ReLU) or with a top_k of the wrong type, tensors the activation does not hold."""
    kwargs = {"activation": "BatchTopK", "threshold": 0.1, **edit}
    if kwargs.get("schema", 5) is None:
        kwargs["header_edits"] = {"schema": None}
    source = saev_ref.write_saev(tmp_path / "s.pt", ref.random_weights(D, N), **kwargs)
    with pytest.raises(UsageError, match=re.escape(words)) as e:
        foreign.convert("saev", source, planted_model(), hook=HOOK)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_saev_topk_keeps_its_top_k_as_they_are_negative_ones_too(tmp_path):
    """saev's TopK keeps ``topk(x)``'s positions without a ReLU: on tokens with fewer than k positive
    pre-activations its codes include negative ones, and the import gives them (and their reconstruction)."""
    w = ref.random_weights(D, N, 4)
    x = torch.from_numpy(interp.cache.open(planted_cache())[HOOK][:2]).reshape(-1, D)
    fifth = (x @ w["W_enc"] + w["b_enc"]).topk(5, dim=-1).values[:, -1]
    w["b_enc"] = w["b_enc"] - fifth.median()  # about half the tokens have fewer than 5 positive pre-activations
    model = planted_model()
    source = saev_ref.write_saev(tmp_path / "s.pt", w, "TopK", top_k=8)
    (tmp_path / "o").mkdir()
    sae = interp.sae.load(save(tmp_path / "o", *foreign.convert("saev", source, model, hook=HOOK)), model=model)
    codes, recon = saev_ref.eval_forward(w, x, "TopK", 8)
    assert (codes < 0).any(1).float().mean() > 0.2  # the case a ReLU first would change
    assert torch.allclose(sae.encode(x), codes, atol=1e-4)
    assert torch.allclose(sae.decode(sae.encode(x)), recon, atol=1e-3)
