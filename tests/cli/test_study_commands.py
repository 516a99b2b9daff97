"""How ``interp study NAME`` runs and saves: the study function is the one bound to the study's config, the
figures come from the plots registry (with the config's figure options), and ``<study>.json`` is written once,
with the skipped images as the result's own field."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from interp.cli import main
from interp.models import sample_image_paths

TWO_PHOTOS = [p for p in sample_image_paths() if p.stem in ("astronaut", "rocket")]


@pytest.fixture()
def photos(tmp_path) -> Path:
    """Two bundled photos and ``broken.jpg`` (not an image)."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for path in TWO_PHOTOS:
        shutil.copy(path, folder / path.name)
    (folder / "broken.jpg").write_bytes(b"not a JPEG")
    return folder


def _json_writes(monkeypatch) -> list:
    """Names of the ``.json`` files written through ``Path.write_text`` (how results are saved)."""
    writes = []
    write_text = Path.write_text

    def counting(self, *args, **kwargs):
        if self.suffix == ".json":
            writes.append(self.name)
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", counting)
    return writes


def test_a_study_json_is_written_once_with_its_skipped_images(tmp_path, photos, monkeypatch, one_thread):
    writes = _json_writes(monkeypatch)
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="broken.jpg"):
        code = main(["study", "masking", "planted_vit", "--images", str(photos), "--out", str(out),
                     "--fractions", "0", "0.5", "--no-progress"])
    assert code == 0
    assert writes == ["masking.json"]  # once: skipped and weights_seed are in it from the start
    data = json.loads((out / "masking.json").read_text())
    assert [Path(s["image"]).name for s in data["skipped"]] == ["broken.jpg"]
    assert "weights_seed" in data and data["figure_files"] == ["masking_curves.png"]


def test_study_figures_come_from_the_registry_with_the_command_options(tmp_path, monkeypatch, one_thread):
    from matplotlib.figure import Figure

    from interp.plots.registry import FIGURES, FigureSpec
    from interp.studies.aggregation.patch_score import PatchScoreResult

    asked = []

    def maps(result, n_maps=8):
        asked.append(n_maps)
        return Figure()

    monkeypatch.setitem(FIGURES, PatchScoreResult, [FigureSpec("my_maps", maps, options=("n_maps",))])
    out = tmp_path / "out"
    assert main(["study", "patch-score", "planted_vit", "--images", str(TWO_PHOTOS[0]), "--out", str(out),
                 "--n-maps", "3", "--no-progress"]) == 0
    assert asked == [3]
    assert json.loads((out / "patch_score.json").read_text())["figure_files"] == ["my_maps.png"]
    assert (out / "my_maps.png").is_file() and not (out / "score_maps.png").exists()


def test_study_commands_run_the_function_bound_to_the_config(tmp_path, monkeypatch, one_thread):
    from interp.studies import declaration
    from interp.studies.artifacts.configs import NormsConfig
    from interp.studies.artifacts.norms import norms_study

    calls = []

    def traced_norms(source, config, **keywords):
        calls.append(config)
        return norms_study(source, config, **keywords)

    monkeypatch.setitem(declaration._FUNCTIONS, NormsConfig, traced_norms)
    out = tmp_path / "out"
    assert main(["study", "norms", "planted_vit", "--images", str(TWO_PHOTOS[0]), "--out", str(out),
                 "--threshold", "p98", "--no-progress"]) == 0
    assert len(calls) == 1 and isinstance(calls[0], NormsConfig) and calls[0].detection.threshold == "p98"
    assert json.loads((out / "norms.json").read_text())["study"] == "norms"
