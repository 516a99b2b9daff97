"""interp compare: one detection rule (a DetectionSpec: threshold, preset, block) for every model, the
redundancy columns, and documented columns that claim no published table."""
from __future__ import annotations


import pytest

import interp
from interp.cli import main
from interp.models import sample_image_paths
from interp.report.compare import COLUMN_DOCS, COLUMNS, CompareSettings, column_table, compare_models
from interp.detection.spec import DetectionSpec

from conftest import REPO, make_model

ROOT = REPO


def test_a_preset_sets_every_models_detection_and_the_redundancy_columns_fill():
    settings = CompareSettings(detection=DetectionSpec(preset="darcet"), probes=False, progress=False)
    result = compare_models([interp.load("planted_vit"), make_model("vit")], sample_image_paths(), settings,
                            names=["planted", "vit"])
    rows = {r["model"]: r for r in result.rows}
    assert rows["planted"]["threshold"] == rows["vit"]["threshold"] == 150.0
    assert result.params["preset"] == "darcet" and result.params["threshold"] == 150.0
    assert result.params["detect_layer"] == -1     # the preset's: the last block of each model
    # the planted model's high-norm tokens are its flat patches: redundant, unlike its normal ones
    assert rows["planted"]["redund_high"] > 0.99 > rows["planted"]["redund_normal"]
    assert rows["vit"]["redund_high"] is None and rows["vit"]["redund_normal"] is not None
    assert "- vit redund_high: no token in this group" in result.table()


def test_the_detection_is_one_spec_in_the_settings():
    models, photos = [interp.load("planted_vit")], sample_image_paths()
    settings = CompareSettings(detection=DetectionSpec(threshold="p98", detect_layer=-2), probes=False,
                               progress=False)
    result = compare_models(models, photos, settings)
    assert result.params["threshold"] == "p98" and result.params["detect_layer"] == -2
    assert result.rows[0]["threshold"] > 0   # the model's own 98th percentile, resolved on its norms
    with pytest.raises(interp.InterpError, match="threshold"):
        compare_models(models, photos, CompareSettings(detection=DetectionSpec(threshold=-3), progress=False))


def test_every_column_is_documented_in_the_readme_and_no_published_table_is_claimed():
    assert set(COLUMN_DOCS) == set(COLUMNS)
    page = (ROOT / "docs" / "studies-compare.md").read_text()  # the columns' table moved from the README
    assert column_table() in page
    import interp.commands.compare as command
    import interp.report.compare as report

    for doc in (command.__doc__, report.__doc__):
        assert "reassessment's table" not in doc and "(the reassessment's)" not in doc
    assert "not a reproduction of any one published table" in report.__doc__


def test_cli_preset_and_detect_layer(capsys, tmp_path):
    assert main(["compare", "planted_vit", "--preset", "darcet", "--detect-layer", "-1", "--no-probes",
                 "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert header.split()[:3] == ["model", "artifacts", "threshold"] and row.split()[2] == "150"
    import json

    assert json.loads((tmp_path / "compare.json").read_text())["params"]["preset"] == "darcet"
    assert main(["compare", "planted_vit", "--preset", "nope"]) == 1   # refused before any model is loaded
    assert "interp: error: unknown preset 'nope'" in capsys.readouterr().err


def test_cli_probe_budget_options_reach_the_probes(capsys, tmp_path):
    """The probes' budget flags (the same as interp study probes) on compare: recorded in compare.json's
    probe_options over compare's own default (min_steps 100)."""
    import json

    assert main(["compare", "planted_vit", "--epochs", "2", "--lr", "0.05", "--no-progress",
                 "--out", str(tmp_path)]) == 0
    params = json.loads((tmp_path / "compare.json").read_text())["params"]
    assert params["probe_options"] == {"min_steps": 100, "epochs": 2, "lr": 0.05}
    assert main(["compare", "planted_vit", "--val-fraction", "0.2"]) == 2
    assert "give --patience N too" in capsys.readouterr().err
