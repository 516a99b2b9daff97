"""The repairs study on the planted models: the repairs that take the planted artifacts away do, the table is
complete with the right costs, a model without registers says Fix-Reg-Mean is n/a, a detection block without
artifacts runs no repair, SINDER's weight-only direction finds the planted artifact channel, and the command line
writes the result and its figure."""
from __future__ import annotations

import json

import pytest

import interp
from interp.cli import main
from interp.detection.spec import DetectionSpec
from interp.models import sample_image_paths
from interp.plots import study_figures
from interp.studies import open_source
from interp.studies.repairs.calibration import REPAIRS
from interp.studies.repairs.repairs import repairs_study

NEURONS = "2:17,2:101,2:402,2:655"  # planted_vit's and planted_dinov3's register neurons (block 2)
FAST = dict(tta_views=3, sinder_samples=400, progress=False)


def photos():
    """Two photos whose flat sky gives the planted models artifacts the automatic split finds (astronaut, rocket);
    the models run at 112 pixels (7 x 7 patches) to keep the tests short."""
    paths = sample_image_paths()
    return [paths[0], paths[3]]


@pytest.fixture(scope="module")
def vit_result():
    source = open_source(model=interp.load("planted_vit", img_size=112), images=photos(), batch_size=2)
    return repairs_study(source, neurons=NEURONS, **FAST)


def test_planted_vit_table(vit_result):
    rows = vit_result.rows
    assert list(rows) == list(REPAIRS)
    assert rows["intact"]["outlier_count"] > 10
    # the planted artifacts: the test-time register, its attention-bias form and mean replacement take them away
    for name in ("test_time_register", "attention_bias", "mean_replacement"):
        assert rows[name]["outlier_count"] == 0, name
        assert rows[name]["cls_attention_on_artifacts"] < rows["intact"]["cls_attention_on_artifacts"] / 2, name
    assert rows["fix_reg_mean"] == {"status": "n/a", "reason": "n/a: the model has no registers"}
    assert {n: r["forwards"] for n, r in rows.items() if r["status"] == "ran"} == {
        "intact": 1, "test_time_register": 1, "attention_bias": 1, "mean_replacement": 1, "regcache": 1, "tta": 3}
    assert rows["intact"]["patch_cosine"] == pytest.approx(1.0) and vit_result.metric == "pooled_cosine"
    assert rows["regcache"]["start"] == 3  # the block after the first with artifacts (block 2)
    assert set(vit_result.block_thresholds) == {2, 3, 4, 5}
    assert len(vit_result.tta["offsets"]) == 3 and vit_result.tta["offsets"][0] == [0, 0]
    lines = vit_result.console_lines()
    assert "down by 90% or more: test-time register, attention bias, mean replacement" in lines[0]


def test_sinder_finds_the_planted_channel(vit_result):
    blocks = vit_result.sinder["blocks"]
    # from the planted block on, the weights' direction is the measured artifact direction and the neurons' write
    assert all(b["cos_measured"] > 0.95 for b in blocks[2:])
    assert min(blocks[2]["neuron_cos"].values()) > 0.95 and blocks[1]["neuron_cos"] == {}
    assert blocks[0]["cos_measured"] < 0.5


def test_no_artifacts_runs_nothing():
    source = open_source(model=interp.load("planted_vit", img_size=112), images=photos(), batch_size=2)
    result = repairs_study(source, detection=DetectionSpec(detect_layer=1), sinder=False, **FAST)
    assert not result.artifacts_found and result.rows == {} and result.sinder is None
    assert "nothing to repair; none was run" in result.message
    assert study_figures(result) == []


def test_planted_dinov3_has_registers_for_fix_reg_mean():
    source = open_source(model=interp.load("planted_dinov3", img_size=112), images=photos(), batch_size=2)
    result = repairs_study(source, neurons=NEURONS, sinder=False, **{**FAST, "tta_views": 2})
    rows = result.rows
    assert rows["fix_reg_mean"]["status"] == "ran" and rows["test_time_register"]["outlier_count"] == 0
    assert rows["mean_replacement"]["outlier_count"] == 0 and rows["intact"]["outlier_count"] > 0


def test_command_line_writes_result_and_figure(tmp_path):
    two = tmp_path / "two.txt"
    two.write_text("".join(f"{p}\n" for p in photos()))
    out = tmp_path / "rep"
    assert main(["study", "repairs", "planted_vit", "--images", str(two), "--tta-views", "2", "--no-sinder",
                 "--out", str(out), "--quiet"]) == 0
    data = json.loads((out / "repairs.json").read_text())
    assert data["rows"]["test_time_register"]["status"] == "n/a" and "--neurons" in data["rows"]["attention_bias"][
        "reason"]
    assert data["rows"]["tta"]["forwards"] == 2 and data["sinder"] is None
    assert (out / "repairs_table.png").stat().st_size > 0
