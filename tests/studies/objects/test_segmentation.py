"""Coarse segmentation from Patch Scores: threshold, upsampling, Jaccard, COCO polygons, the study end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_model
from PIL import Image

from interp.errors import InterpError
from interp.models import sample_image_paths
from interp.studies import open_source
from interp.studies.core.stats import iou as jaccard
from interp.studies.objects.seg_scoring import upsample_nearest
from interp.studies.objects.segment import (foreground_cells, ground_truth_masks, rasterise_polygons, read_coco_polygons,
                                         segment_study)


def test_threshold_upsample_and_jaccard_on_a_constructed_map():
    score = torch.zeros(4, 4)
    score[:2, :2] = 1.0                       # mean 0.25, std 0.433: only the 2x2 block is above mean + std
    cells = foreground_cells(score)
    assert cells.sum() == 4 and cells[:2, :2].all()
    pred = upsample_nearest(cells, (8, 8))    # each cell -> 2x2 pixels: the top-left 4x4 pixels
    assert pred.sum() == 16 and pred[:4, :4].all()
    gt = torch.zeros(8, 8, dtype=torch.bool)
    gt[:4, :6] = True                         # 24 pixels, 16 shared, union 24
    assert jaccard(pred, gt) == pytest.approx(16 / 24)
    assert jaccard(pred, ~pred) == 0.0 and jaccard(pred, pred) == 1.0
    assert jaccard(torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.bool)) is None
    assert foreground_cells(score, k_std=-10).all()
    with pytest.raises(InterpError, match="shapes"):
        jaccard(pred, gt[:4])


def test_coco_polygons_are_rasterised():
    mask = rasterise_polygons([[2, 1, 6, 1, 6, 4, 2, 4], [0, 0, 1, 0, 1, 1]], (8, 6))
    assert mask.shape == (6, 8)
    assert mask[1:5, 2:7].all() and mask[1:5, 2:7].sum() == 20   # PIL fills the polygon border pixels too
    assert not mask[5].any() and not mask[:, 7].any()


def test_study_whole_image_mask_gives_the_foreground_share(tmp_path):
    model = make_model("vit")
    paths = sample_image_paths()[:2]
    masks = tmp_path / "masks"
    masks.mkdir()
    for p in paths:                           # the whole image is foreground: Jaccard = predicted share
        with Image.open(p) as im:
            Image.fromarray(np.full((im.height, im.width), 255, dtype=np.uint8)).save(masks / f"{p.stem}.png")
    source = open_source(model=model, images=[str(p) for p in sample_image_paths()[:3]])
    result = segment_study(source, masks=masks, with_selective=False, reference="cls", progress=False)
    assert result.jaccard[:2] == pytest.approx(result.foreground_share[:2]) and result.jaccard[2] is None
    assert 0 < result.foreground_share[0] < 0.5 and result.n_evaluated == 2
    assert result.input_size == [224, 224]
    assert json.loads(result.to_json())["mean_jaccard"] == pytest.approx(np.mean(result.jaccard[:2]))


def test_study_coco_polygons_and_errors(tmp_path):
    model = make_model("vit")
    path = sample_image_paths()[0]
    with Image.open(path) as im:
        w, h = im.size
    coco = {"images": [{"id": 1, "file_name": path.name, "width": w, "height": h}],
            "annotations": [{"image_id": 1, "bbox": [0, 0, w, h], "segmentation": [[0, 0, w, 0, w, h, 0, h]]}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    source = open_source(model=model, images=[str(path)])
    result = segment_study(source, masks=tmp_path / "coco.json", with_selective=False, progress=False)
    assert result.jaccard[0] == pytest.approx(result.foreground_share[0])
    coco["annotations"][0]["segmentation"] = {"counts": "abc", "size": [h, w]}
    (tmp_path / "rle.json").write_text(json.dumps(coco))
    with pytest.raises(InterpError, match="RLE"):
        segment_study(source, masks=tmp_path / "rle.json", with_selective=False, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InterpError, match="no image of the source has a ground-truth mask"):
        segment_study(source, masks=tmp_path / "empty", with_selective=False, progress=False)


def test_coco_file_names_are_normalised_like_box_files(tmp_path):
    coco = {"images": [{"id": 1, "file_name": "./x.jpg", "width": 4, "height": 3},
                       {"id": 2, "file_name": "sub\\y.jpg", "width": 4, "height": 3}],
            "annotations": [{"image_id": 1, "segmentation": [[0, 0, 2, 0, 2, 2, 0, 2]]}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    table = read_coco_polygons(tmp_path / "coco.json")
    assert set(table) == {"x.jpg", "sub/y.jpg"}
    masks = ground_truth_masks(["x.jpg", "sub/y.jpg"], tmp_path / "coco.json")
    assert masks[0].shape == (3, 4) and masks[0].any() and not masks[1].any()
