"""Patch Score distribution options: per-image min-max normalisation and the majority-overlap cell rule
(a patch belongs to a box when most of its area is inside), on crafted boxes, masks and maps."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_model
from PIL import Image

from interp.errors import InterpError
from interp.models import data_config
from interp.studies.aggregation.patch_score import PatchScoreResult, normalise_maps, patch_score_study
from interp.runtime.open import open_source
from interp.formats.box_files import read_boxes
from interp.formats.box_types import Box
from interp.studies.core.regions import box_cells, regions_from_boxes, regions_from_masks


@pytest.fixture(scope="module")
def dino():
    # crop_pct 1.0 at 224: a 224x224 image passes the preprocessing unchanged (boxes in input pixels, 14 px cells).
    return make_model("dinov2", depth=1)


def test_majority_rule_keeps_cells_mostly_inside_the_box():
    box = Box(6.0, 0.0, 23.0, 10.0)        # 10 px cells: x covers 4/10 of col 0, all of col 1, 3/10 of col 2
    touch = box_cells(box, (3, 3), (10, 10))
    major = box_cells(box, (3, 3), (10, 10), "majority")
    assert touch[0].tolist() == [True, True, True] and not touch[1:].any()
    assert major[0].tolist() == [False, True, False] and not major[1:].any()
    half = box_cells(Box(0.0, 0.0, 5.0, 10.0), (3, 3), (10, 10), "majority")
    assert not half.any()                  # exactly half of a cell is not "most of its area"
    corner = box_cells(Box(0.0, 0.0, 8.0, 8.0), (3, 3), (10, 10), "majority")   # 64 % of cell (0, 0)
    assert corner.sum() == 1 and corner[0, 0]
    with pytest.raises(InterpError, match="cell_rule="):
        box_cells(box, (3, 3), (10, 10), "centre")


def test_majority_rule_on_boxes_and_masks_through_the_preprocessing(dino, tmp_path):
    cfg = data_config(dino)
    (tmp_path / "b.csv").write_text("image,x0,y0,x1,y1,width,height\na.png,10,0,40,14,224,224\n")
    table = read_boxes(tmp_path / "b.csv")
    touch = regions_from_boxes(["/x/a.png"], table, cfg, (16, 16))
    major = regions_from_boxes(["/x/a.png"], table, cfg, (16, 16), cell_rule="majority")
    # x 10..40 over 14 px cells: col 0 has 4/14, col 1 all, col 2 12/14 -> touch cols 0-2, majority cols 1-2
    assert touch.inside[0, 0].nonzero().flatten().tolist() == [0, 1, 2]
    assert major.inside[0, 0].nonzero().flatten().tolist() == [1, 2] and major.cell_rule == "majority"
    mask = np.zeros((224, 224), dtype=np.uint8)
    mask[0:14, 0:4] = 255                 # 4/14 of cell (0, 0)
    mask[0:14, 14:25] = 255               # 11/14 of cell (0, 1)
    (tmp_path / "m").mkdir()
    Image.fromarray(mask).save(tmp_path / "m" / "a.png")
    m_touch = regions_from_masks(["/x/a.png"], tmp_path / "m", cfg, (16, 16))
    m_major = regions_from_masks(["/x/a.png"], tmp_path / "m", cfg, (16, 16), cell_rule="majority")
    assert m_touch.inside[0].nonzero().tolist() == [[0, 0], [0, 1]]
    assert m_major.inside[0].nonzero().tolist() == [[0, 1]]


def test_minmax_normalisation_per_image():
    maps = torch.tensor([[[0.2, 0.4], [0.6, 1.0]], [[-0.5, -0.5], [-0.5, -0.5]], [[-1.0, 0.0], [0.5, 1.0]]])
    out = normalise_maps(maps, "minmax")
    assert out[0].flatten().tolist() == pytest.approx([0.0, 0.25, 0.5, 1.0])
    assert out[1].eq(0).all()              # a constant map has no range: all 0
    assert out[2].flatten().tolist() == pytest.approx([0.0, 0.5, 0.75, 1.0])
    assert normalise_maps(maps, "none") is maps
    with pytest.raises(InterpError, match="normalise="):
        normalise_maps(maps, "zscore")


def test_study_distributions_use_the_options_and_maps_stay_raw(dino, tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "imgs").mkdir()
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(tmp_path / "imgs" / f"img{i}.png")
    (tmp_path / "b.csv").write_text("image,x0,y0,x1,y1\nimg0.png,10,10,60,50\nimg1.png,100,30,200,120\n")
    source = open_source(model=dino, images=str(tmp_path / "imgs"))
    table = read_boxes(tmp_path / "b.csv")
    plain = patch_score_study(source, regions=regions_from_boxes(source.ids, table, source.data_config(), (16, 16)),
                              progress=False)
    regions = regions_from_boxes(source.ids, table, source.data_config(), (16, 16), cell_rule="majority")
    result = patch_score_study(source, regions=regions, normalise="minmax", progress=False)
    maps = result.maps_tensor()
    assert torch.allclose(maps, plain.maps_tensor())             # the maps are the raw cosines either way
    scaled = normalise_maps(maps, "minmax")
    inside = regions.inside
    assert result.fg.n == int(inside.sum()) < plain.fg.n            # majority keeps fewer cells than touch
    assert result.fg.mean == pytest.approx(float(scaled[inside].mean()), abs=1e-6)
    assert result.bg.mean == pytest.approx(float(scaled[~inside].mean()), abs=1e-6)
    assert result.scores.mean == pytest.approx(float(scaled.mean()), abs=1e-6)
    assert 0 <= result.scores.quantiles["q05"] and result.scores.quantiles["q95"] <= 1
    assert result.normalise == "minmax" and result.cell_rule == "majority" and plain.cell_rule == "touch"
    result.to_json(tmp_path / "ps.json")
    back = PatchScoreResult.from_json(tmp_path / "ps.json")
    assert back.normalise == "minmax" and back.params["cell_rule"] == "majority"


def test_patch_score_cli_options(tmp_path):
    from interp.cli import main
    from interp.models import sample_image_paths

    paths = sample_image_paths()
    (tmp_path / "b.csv").write_text("image,x0,y0,x1,y1\nastronaut.jpg,60,20,200,160\n")
    out = tmp_path / "out"
    assert main(["study", "patch-score", "planted_vit", "--images", str(paths[0].parent), "--boxes",
                 str(tmp_path / "b.csv"), "--cell-rule", "majority", "--normalise", "minmax", "--out", str(out),
                 "--no-progress"]) == 0
    data = json.loads((out / "patch_score.json").read_text())
    assert data["normalise"] == "minmax" and data["cell_rule"] == "majority"
    assert 0 <= data["fg"]["mean"] <= 1 and (out / "score_distributions.png").exists()
