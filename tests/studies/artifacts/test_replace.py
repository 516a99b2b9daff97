"""The token-replacement study tells a register whose presence alone matters from one whose image-specific content
the model reads (two planted models, tests/planted_tokens.py), says when replacing does nothing, and runs through
the command line with its figure."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import one_error_line
from interp.cli import main
from interp.models.inputs.samples import SAMPLES_DIR
from interp.studies import open_source
from interp.studies.artifacts.replace import replace_study, verdict
from planted_tokens import planted_register_model


def pics(seed=0, n=8):
    return torch.randn(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", [0, 3])
def test_fungible_and_image_specific_registers_are_told_apart(seed):
    x = pics(seed)
    fungible = replace_study(open_source(model=planted_register_model("fungible", seed), images=x, batch_size=4),
                             seed=seed, progress=False)
    specific = replace_study(open_source(model=planted_register_model("image-specific", seed), images=x,
                                         batch_size=4), seed=seed, progress=False)
    f, s = ({k: v["effect"] for k, v in r.conditions.items()} for r in (fungible, specific))
    assert fungible.metric == specific.metric == "pooled_cosine"  # no head: the pooled vector, and it says so
    # presence only: zeroing hurts, the in-distribution replacements change nothing
    assert f["zero"] > 0.2 and max(f["mean"], f["noise"], f["shuffle"]) < 0.01 and f["control"] < 0.01
    assert fungible.verdict == "presence only" and "overstates" in fungible.message
    # image-specific: another image's register (and the mean) hurt, more than zeroing it
    assert s["shuffle"] > 0.3 and s["mean"] > 0.2 and s["shuffle"] > s["zero"] and s["control"] < 0.01
    assert specific.verdict == "image-specific content"
    # zeroing the register moves the CLS attention (the sink goes); the random patches barely do
    assert fungible.conditions["zero"]["attention_js_mean"] > 10 * fungible.conditions["control"]["attention_js_mean"]


def test_verdict_rules():
    assert verdict({"zero": 0.005, "control": 0.0}) == "not needed"
    assert verdict({"zero": 0.3, "mean": 0.01, "shuffle": 0.02, "control": 0.0}) == "presence only"
    assert verdict({"zero": 0.3, "mean": 0.2, "shuffle": 0.05, "control": 0.0}) == "mixed"
    assert verdict({"zero": 0.05, "mean": 0.3, "shuffle": 0.6, "control": 0.0}) == "image-specific content"
    assert verdict({"zero": 0.04, "control": 0.05}) == "not needed"  # no more than the random control


def test_command_line_writes_result_and_figure(tmp_path, capsys, monkeypatch):
    """planted_vit has CLS and no register: auto replaces CLS; singles need several tokens."""
    out = tmp_path / "rep"
    two = tmp_path / "two.txt"  # two photos keep it short
    two.write_text("".join(f"{p}\n" for p in sorted(SAMPLES_DIR.glob("*.jpg"))[:2]))
    assert main(["study", "replace", "planted_vit", "--images", str(two), "--modes", "zero,mean", "--out", str(out),
                 "--quiet"]) == 0
    data = json.loads((out / "replace.json").read_text())
    assert data["target"] == "cls" and data["singles"] is None and set(data["conditions"]) == {
        "intact", "zero", "mean", "control"}
    assert (out / "replacement_effects.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["study", "replace", "planted_vit", "--images", "interp/data/samples", "--modes", "zero,blur",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--modes" in one_error_line(capsys.readouterr().err)
