"""``interp report --sae DIR``: an appendix with the sae-features study on the report's images, compared with the
register neurons the report ranked. Reuses the SAE of tests/sae_helpers.py."""
from __future__ import annotations

import json

import interp
from interp.cli import main
from sae_helpers import HOOK, needs_overcomplete, planted_sae


@needs_overcomplete
def test_the_report_adds_an_sae_appendix(tmp_path, capsys, one_thread):
    out = tmp_path / "report"
    photos = str(interp.models.sample_image_paths()[0].parent)  # 4 photos: quicker than the default 16
    assert main(["report", "--sae", str(planted_sae()), "--images", photos, "--out", str(out), "--controls",
                 "1"]) == 0
    summary = json.loads((out / "report.json").read_text())
    sae = summary["sae_features"]
    assert sae["hook"] == HOOK and "sae_features.json" in summary["files"]["results"]
    assert sae["neurons"]  # compared with the neurons the report ranked
    page = (out / "index.html").read_text()
    assert "Appendix: SAE features (sae-features)" in page and 'data-file="sae_top_patches.png"' in page
    assert "[appendix] SAE features" in capsys.readouterr().err
    assert main(["report", "--sae", str(tmp_path), "--out", str(tmp_path / "r2")]) == 2
    assert "no sae.json there" in capsys.readouterr().err
