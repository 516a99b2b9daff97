"""SAEs of SAELens, saev and ViT-Prisma (fixtures written as those projects write them, tests/reference/
foreign_sae.py) imported with `interp sae import`: the same codes and reconstructions as the projects' own
forward passes, then sae-features and an ablation patch on each."""
from __future__ import annotations

import json

import pytest
import torch

import interp
from interp.cli import main
from interp.errors import InterpError
from interp.sae import foreign
from interp.sae.features import sae_features
from reference import foreign_sae as ref
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
