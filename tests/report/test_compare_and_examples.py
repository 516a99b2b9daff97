"""Cross-model comparison table, and the examples run as scripts."""
from __future__ import annotations

import sys

import pytest

import interp
from interp.cli import main
from interp.models import sample_image_paths
from interp.report.compare import COLUMNS, CompareSettings, compare_models

from conftest import REPO, make_model

ROOT = REPO


def test_compare_flags_planted_model_only():
    result = compare_models([interp.load("planted_vit"), make_model("vit"), make_model("dinov2_reg")],
                            sample_image_paths(), CompareSettings(progress=False), names=["planted", "vit", "dinov2_reg"])
    rows = {r["model"]: r for r in result.rows}
    assert set(rows["planted"]) == set(COLUMNS)
    assert rows["planted"]["artifacts"] and rows["planted"]["emergence"] == "2 (mlp)"
    assert not rows["vit"]["artifacts"] and not rows["dinov2_reg"]["artifacts"]
    assert result.table().splitlines()[0].split() == list(COLUMNS)
    # four photos are too few for probe scores: "-" in every probe cell, and the reason under the table
    assert all(rows[m][c] is None for m in rows for c in ("pos_normal", "pos_high", "pix_normal", "pix_high"))
    assert "- planted pos_normal, pix_normal: too few images (n=4)" in result.table()  # (the 4 images' split holds
    # no high-norm token on the test side: pos_high and pix_high say so)
    assert "- vit pos_high, pix_high: empty: no high-norm patch token" in result.table()  # empty wins


def test_compare_probe_columns_score_with_enough_images(photos16):
    settings = CompareSettings(probe_tokens=400, probe_options={"min_steps": 30}, progress=False)
    result = compare_models([interp.load("planted_vit"), make_model("vit")], photos16, settings,
                            names=["planted", "vit"])
    rows = {r["model"]: r for r in result.rows}
    # the probe columns: scores on the planted model's high-norm patches; empty groups are None ("-")
    assert all(rows["planted"][c] is not None for c in ("pos_normal", "pos_high", "pix_normal", "pix_high",
                                                        "pos_chance"))
    assert rows["vit"]["pos_high"] is None and rows["vit"]["pos_normal"] is not None
    assert rows["planted"]["glob_cls"] is None  # the photos carry no labels
    vit_line = next(line for line in result.table().splitlines() if line.startswith("vit "))
    assert vit_line.split()[list(COLUMNS).index("pos_high")] == "-"
    assert "- vit pos_high, pix_high: empty: no high-norm patch token" in result.table()  # why it is "-"
    assert not any(line.startswith("- planted") for line in result.table().splitlines())


@pytest.mark.slow  # end to end (a whole run or a fresh process); runs once, also in CI
def test_compare_cli(tmp_path, capsys):
    assert main(["compare", "planted_vit", "vit_small_patch16_224", "--no-pretrained", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "planted_vit" in out and "vit_small_patch16_224" in out
    # the four bundled photos are too few for probe scores: "-" and the reason, not a number
    assert "- planted_vit pos_normal, pix_normal: too few images (n=4) for a probe score" in out
    assert (tmp_path / "compare.json").exists()


def run_example(name: str, capsys, monkeypatch) -> str:
    """Run ``examples/<name>`` as a script (``__main__``, from the repository root) in this process: the same
    code path as ``python examples/<name>`` without a second interpreter importing torch (seconds per example);
    the global torch RNG is restored afterwards."""
    import runpy

    import torch

    path = ROOT / "examples" / name
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [str(path)])
    with torch.random.fork_rng():
        runpy.run_path(str(path), run_name="__main__")
    return capsys.readouterr().out


def test_example_nnsight_edit(capsys, monkeypatch):
    out = run_example("nnsight_edit.py", capsys, monkeypatch)
    assert "nnsight edit vs hook edit, max |diff|: 0.00e+00" in out


def test_example_artifact_tour(capsys, monkeypatch):
    out = run_example("artifact_tour.py", capsys, monkeypatch)
    assert "artifacts found: True" in out
    assert "register neurons: [(2, 17" in out
