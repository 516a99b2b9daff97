"""``interp study probes|lost|segment`` end to end on the planted model, and their registered figures."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from interp.cli import main
from interp.models import sample_image_paths
from interp.plots.registry import has_figures
from interp.studies.objects.lost import RUN_FIELDS, LostResult
from interp.studies.probes.probes import ProbesResult
from interp.studies.core.result import result_html
from interp.studies.objects.segment import SegmentResult

PLANTED_NEURON = "2:17"  # a planted register neuron (interp.models.planted)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny probes run faster on one thread


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """The four sample photos in an image-folder layout of two classes (DIR/<class>/img)."""
    root = tmp_path_factory.mktemp("labelled")
    for i, path in enumerate(sample_image_paths()):
        (root / "ab"[i // 2]).mkdir(exist_ok=True)
        shutil.copy(path, root / "ab"[i // 2] / path.name)
    return root


def test_probes_cli_writes_scores_with_chance_and_figure(labelled16, tmp_path):
    assert main(["study", "probes", "planted_vit", "--images", str(labelled16), "--out", str(tmp_path),
                 "--max-train-tokens", "300", "--max-test-tokens", "100", "--no-progress"]) == 0
    data = json.loads((tmp_path / "probes.json").read_text())
    result = ProbesResult.from_dict(data)
    assert data["figure_files"] == ["probes.png"] and (tmp_path / "probes.png").stat().st_size > 0
    assert result.high_norm_share > 0 and result.n_test_images == 4 and result.too_few is None
    for probe in ("position", "pixels"):
        for group in ("normal", "high_norm"):
            entry = getattr(result, probe)[group]
            assert entry.n > 0 and entry.score is not None and entry.chance is not None
    assert result.label["register"].score is None and "no register" in result.label["register"].note
    assert "too few held-out cls images (n=4)" in result.label["cls"].note  # labels came from the folder layout
    assert "<img alt='probes'" in result_html(result)


def test_probes_cli_on_four_images_prints_the_reason_not_a_number(labelled, tmp_path, capsys):
    assert main(["study", "probes", "planted_vit", "--images", str(labelled), "--out", str(tmp_path),
                 "--max-train-tokens", "300", "--max-test-tokens", "100", "--no-progress"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("position", "pixels"))]
    assert len(lines) == 4 and all("too few images (n=4) for a probe score; need >= 16" in line for line in lines)
    assert not any("chance" in line for line in lines)
    data = json.loads((tmp_path / "probes.json").read_text())
    assert data["pixels"]["normal"]["score"] is None and data["too_few"].startswith("too few images (n=4)")


def test_lost_cli_with_test_time_register_and_corloc(tmp_path):
    plain_dir = tmp_path / "plain"
    assert main(["study", "lost", "planted_vit", "--images", str(sample_image_paths()[0].parent),
                 "--out", str(plain_dir), "--no-progress"]) == 0
    plain = LostResult.from_json(plain_dir / "lost.json")
    assert plain.edited is None and plain.corloc is None and len(plain.seeds) == 4
    # Ground truth = the plain run's own boxes: CorLoc must be 1 without the intervention.
    rows = ["image,x0,y0,x1,y1"] + [f"{p.split('/')[-1]},{','.join(f'{v:.3f}' for v in b)}"
                                    for p, b in zip(plain.ids, plain.boxes)]
    (tmp_path / "gt.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "edited"
    assert main(["study", "lost", "planted_vit", "--images", str(sample_image_paths()[0].parent), "--out", str(out),
                 "--boxes", str(tmp_path / "gt.csv"), "--neurons", PLANTED_NEURON, "--no-progress"]) == 0
    result = LostResult.from_json(out / "lost.json")
    assert result.corloc == 1.0 and result.seeds == plain.seeds
    assert result.intervention["kind"] == "TestTimeRegister" and set(result.edited) == set(RUN_FIELDS)
    assert result.edited["corloc"] is not None and len(result.edited["seeds"]) == 4
    assert np.asarray(result.edited["masks"]).shape == (4, *result.grid)
    assert (out / "lost_boxes.png").exists()


def test_segment_cli_whole_image_masks_give_the_foreground_share(tmp_path):
    masks = tmp_path / "masks"
    masks.mkdir()
    paths = sample_image_paths()
    for p in paths[:2]:  # the whole image is foreground: Jaccard = the predicted share, for every variant
        with Image.open(p) as im:
            Image.fromarray(np.full((im.height, im.width), 255, dtype=np.uint8)).save(masks / f"{p.stem}.png")
    out = tmp_path / "out"
    assert main(["study", "segment", "planted_vit", "--images", str(paths[0].parent), "--masks", str(masks),
                 "--out", str(out), "--neurons", PLANTED_NEURON, "--no-progress"]) == 0
    result = SegmentResult.from_json(out / "segment.json")
    assert set(result.variants) == {"selective (k=1)", "cls + TestTimeRegister"}
    runs = [(result.jaccard, result.foreground_share)] + [(v["jaccard"], v["foreground_share"])
                                                          for v in result.variants.values()]
    for jac, share in runs:
        assert jac[:2] == pytest.approx(share[:2]) and jac[2:] == [None, None]
    assert any(s > 0 for _, share in runs for s in share)
    assert (out / "segmentation_overlays.png").exists()
    # a second run must refuse to replace segment.json (no --overwrite)
    assert main(["study", "segment", "planted_vit", "--images", str(paths[0].parent), "--masks", str(masks),
                 "--out", str(out), "--no-progress"]) == 1


def test_a_result_without_registered_figures_has_none():
    assert not has_figures("no_such_study") and not has_figures(object())
