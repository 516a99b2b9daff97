"""Segmentation scored as the published protocol does: palette masks read by index with void (255) left out,
mIoU over background/foreground per image or from dataset sums (against mmsegmentation's arithmetic,
tests/reference/mmseg_mean_iou.py), and scoring on the full original image."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from conftest import make_model
from PIL import Image
from reference.mmseg_mean_iou import dataset_miou, image_mean_miou

from interp.errors import InterpError
from interp.models import sample_image_paths
from interp.studies import open_source
from interp.formats.masks import read_label_mask, read_mask
from interp.models.inputs.geometry import input_geometry, mask_to_input, mask_to_original
from interp.models.inputs.preprocessing import timm_transform
from interp.studies.objects.seg_scoring import class_areas, reduce_areas, upsample_nearest
from interp.studies.objects.segment import segment_study

# Pascal VOC's palette: index 0 black (background), 1 dark red (aeroplane), 255 cream (void border).
VOC_PALETTE = [0, 0, 0, 128, 0, 0, 0, 128, 0] + [0, 0, 0] * 252 + [224, 224, 192]


def palette_mask(index: np.ndarray, path) -> None:
    """Save a class-index map [H, W] as a VOC-style palette PNG (mode "P")."""
    im = Image.fromarray(index.astype(np.uint8), mode="P")
    im.putpalette(VOC_PALETTE)
    im.save(path)


def voc_like(width: int, height: int, border: int = 6) -> np.ndarray:
    """Background, an object (class 1) with a void band of ``border`` pixels around it, as VOC draws them."""
    index = np.zeros((height, width), dtype=np.uint8)
    y0, y1, x0, x1 = height // 4, 3 * height // 4, width // 4, 3 * width // 4
    index[y0 - border:y1 + border, x0 - border:x1 + border] = 255
    index[y0:y1, x0:x1] = 1
    return index


def test_palette_mask_is_read_by_index_and_its_void_border_is_not_foreground(tmp_path):
    index = voc_like(40, 30, border=3)
    index[0, 0] = 2                                   # another class: still foreground
    palette_mask(index, tmp_path / "m.png")
    with Image.open(tmp_path / "m.png") as im:
        assert im.mode == "P" and (np.asarray(im.convert("L")) > 0).sum() > (index == 1).sum() + 1  # gray: void lit
    fg, void = read_label_mask(tmp_path / "m.png")
    assert np.array_equal(fg, (index == 1) | (index == 2)) and np.array_equal(void, index == 255)
    assert np.array_equal(read_mask(tmp_path / "m.png"), fg)      # the box/PiB reader agrees
    gray = np.zeros((30, 40), dtype=np.uint8)
    gray[5:10, 5:10] = 255                                        # an ordinary 0/255 mask: no void
    Image.fromarray(gray).save(tmp_path / "g.png")
    fg, void = read_label_mask(tmp_path / "g.png")
    assert fg.sum() == 25 and not void.any()


def test_class_areas_and_reductions_equal_mmsegmentation_on_crafted_masks():
    rng = np.random.default_rng(0)
    preds, labels, areas = [], [], []
    for i in range(4):                                # images of different sizes and foreground shares
        h, w = 12 + i, 9 + 2 * i
        pred = rng.random((h, w)) < 0.3 + 0.1 * i
        label = (rng.random((h, w)) < 0.5).astype(np.uint8)
        label[rng.random((h, w)) < 0.15] = 255        # void
        preds.append(pred.astype(np.uint8))
        labels.append(label)
        areas.append(class_areas(pred, label == 1, label != 255))
    iou, miou = dataset_miou(preds, labels)
    out = reduce_areas(areas, "dataset")
    assert out["miou"] == pytest.approx(miou, abs=1e-12)
    assert [out["class_iou"]["background"], out["class_iou"]["foreground"]] == pytest.approx(iou.tolist())
    per_image = reduce_areas(areas, "image")
    assert per_image["miou"] == pytest.approx(image_mean_miou(preds, labels), abs=1e-12)
    assert per_image["miou"] != pytest.approx(out["miou"], abs=1e-6)   # the two reductions differ here
    # a class absent from prediction and label in one image is left out of that image's mean (nan-mean)
    empty = class_areas(np.zeros((3, 3), bool), np.zeros((3, 3), bool))
    alone = reduce_areas([empty], "image")
    assert alone["miou"] == 1.0 and alone["class_iou"]["foreground"] is None
    with pytest.raises(InterpError, match="average="):
        reduce_areas(areas, "pixels")


def test_original_frame_mapping_is_the_inverse_of_the_input_mapping():
    cfg = {"input_size": (3, 32, 32), "interpolation": "bicubic", "crop_pct": 0.875, "crop_mode": "center",
           "mean": (0.5,) * 3, "std": (0.5,) * 3}
    geometry = input_geometry(timm_transform(cfg), (48, 40))    # resized then centre-cropped
    rng = np.random.default_rng(1)
    cells = torch.from_numpy(rng.random((4, 4)) < 0.5)
    pred_input = upsample_nearest(cells, (32, 32)).numpy()
    back, seen = mask_to_original(pred_input, geometry)
    assert back.shape == (40, 48) and 0 < seen.mean() < 1        # the crop hides a border of the original
    again = mask_to_input(back, geometry).numpy()                 # original -> input recovers the prediction
    assert (again == pred_input).mean() > 0.97


def _study_inputs(tmp_path, n=3):
    model = make_model("vit")
    paths = sample_image_paths()[:n]
    masks = tmp_path / "masks"
    masks.mkdir()
    truth = {}
    for p in paths:
        with Image.open(p) as im:
            index = voc_like(im.width, im.height, border=8)
        palette_mask(index, masks / f"{p.stem}.png")
        truth[p.stem] = index
    return model, paths, masks, truth


def test_study_leaves_void_out_and_reports_miou_both_ways(tmp_path):
    model, paths, masks, truth = _study_inputs(tmp_path)
    source = open_source(model=model, images=[str(p) for p in paths])
    per_image = segment_study(source, masks=masks, with_selective=False, progress=False)
    dataset = segment_study(source, masks=masks, with_selective=False, average="dataset", progress=False)
    transform = timm_transform(source.data_config())
    preds, labels = [], []
    for i, p in enumerate(paths):                 # the oracle on the same prediction and the mapped label map
        index = truth[p.stem]
        geometry = input_geometry(transform, (index.shape[1], index.shape[0]))
        rows = np.floor((np.arange(224) + 0.5 - geometry.offset_y) / geometry.scale_y).astype(int)
        cols = np.floor((np.arange(224) + 0.5 - geometry.offset_x) / geometry.scale_x).astype(int)
        label = index[np.ix_(rows, cols)].copy()
        label[(label != 0) & (label != 255)] = 1
        cells = torch.tensor(per_image.foreground[i], dtype=torch.bool)
        preds.append(upsample_nearest(cells, (224, 224)).numpy().astype(np.uint8))
        labels.append(label)
        # each scored pixel is in its class's intersection and union when right, in both unions when wrong
        inter, union = per_image.areas[i]["intersection"], per_image.areas[i]["union"]
        assert sum(union) + sum(inter) == 2 * int((label != 255).sum())
    iou, miou = dataset_miou(preds, labels)
    assert dataset.miou == pytest.approx(miou) and dataset.average == "dataset"
    assert dataset.class_iou["foreground"] == pytest.approx(iou[1])
    assert per_image.miou == pytest.approx(image_mean_miou(preds, labels))
    fg_iou = [((p == 1) & (g == 1)).sum() / ((p == 1) & (g != 255) | (g == 1)).sum() for p, g in zip(preds, labels)]
    assert per_image.jaccard == pytest.approx(fg_iou)             # the void band is neither fg nor bg
    assert per_image.n_scored == 3 and per_image.unseen_share == [0.0, 0.0, 0.0]
    saved = json.loads(dataset.to_json())
    assert saved["miou"] == pytest.approx(miou) and saved["params"]["average"] == "dataset"
    assert "mIoU" in dataset.summary() and "dataset sums" in dataset.summary()


def test_full_frame_scores_every_original_pixel(tmp_path):
    model, paths, masks, truth = _study_inputs(tmp_path, n=2)
    source = open_source(model=model, images=[str(p) for p in paths])
    assert source.data_config()["crop_pct"] < 1                  # the model's transform crops a border
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        full = segment_study(source, masks=masks, with_selective=False, frame="full", progress=False)
    inner = segment_study(source, masks=masks, with_selective=False, progress=False)
    for i, p in enumerate(paths):
        index = truth[p.stem]
        scored = int((index != 255).sum())
        inter, union = full.areas[i]["intersection"], full.areas[i]["union"]
        assert sum(union) + sum(inter) == 2 * scored           # every non-void original pixel is scored
    assert full.frame == "full" and inner.frame == "input"
    assert all(s > 0 for s in full.unseen_share)
    assert any("does not show" in str(w.message) for w in caught)
    assert full.miou is not None and full.miou != pytest.approx(inner.miou, abs=1e-9)
    with pytest.raises(InterpError, match="frame="):
        segment_study(source, masks=masks, with_selective=False, frame="crop", progress=False)


def test_segment_cli_average_and_frame_options(tmp_path):
    from interp.cli import main
    from interp.studies.objects.segment import SegmentResult

    _, paths, masks, _ = _study_inputs(tmp_path, n=2)
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["study", "segment", "planted_vit", "--images", str(paths[0].parent), "--masks", str(masks),
                     "--out", str(out), "--average", "dataset", "--frame", "full", "--whole-image", "--no-selective",
                     "--no-progress"]) == 0
    result = SegmentResult.from_json(out / "segment.json")
    assert result.average == "dataset" and result.frame == "full" and result.n_scored == 2 and result.whole_image
    assert result.unseen_share[:2] == [0.0, 0.0]
    assert result.areas[2:] == [None, None]                       # the other sample photos have no mask
    inter = np.sum([a["intersection"] for a in result.areas[:2]], axis=0)
    union = np.sum([a["union"] for a in result.areas[:2]], axis=0)
    assert result.miou == pytest.approx(float(np.mean(inter / union)))
    assert (out / "segmentation_overlays.png").exists()


def test_whole_image_shows_the_model_each_image_uncropped(tmp_path):
    from timm.data import create_transform

    from interp.studies.objects.whole_image import whole_image_source

    model, paths, masks, truth = _study_inputs(tmp_path, n=2)
    source = open_source(model=model, images=[str(p) for p in paths])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        whole = segment_study(source, masks=masks, with_selective=False, frame="full", whole_image=True,
                              progress=False)
    assert whole.whole_image is True and whole.params["whole_image"] is True
    assert whole.unseen_share == [0.0, 0.0] and not any("does not show" in str(w.message) for w in caught)
    for i, p in enumerate(paths):                     # every non-void original pixel is scored
        inter, union = whole.areas[i]["intersection"], whole.areas[i]["union"]
        assert sum(union) + sum(inter) == 2 * int((truth[p.stem] != 255).sum())
    view = whole_image_source(source)
    cfg = view.data_config()
    assert cfg["crop_mode"] == "squash" and cfg["crop_pct"] == 1.0 and source.data_config()["crop_pct"] == 0.9
    expected = create_transform(**cfg, is_training=False)(Image.open(paths[1]).convert("RGB"))
    _, x = next(view.image_batches(2))
    assert torch.allclose(x[1], expected, atol=1e-6)   # chelsea (385 x 256) squashed whole into 224 x 224
    cropped = segment_study(source, masks=masks, with_selective=False, progress=False)
    assert whole.foreground != cropped.foreground      # the model saw other pixels
    with pytest.raises(InterpError, match="live source over image files"):
        segment_study(open_source(model=model, images=torch.zeros(1, 3, 224, 224)), masks=masks,
                      with_selective=False, whole_image=True, progress=False)
