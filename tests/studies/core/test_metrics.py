"""One IoU for the studies, one rule for empty sets (None), and one mask-file discovery for boxes and segmentation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from interp.errors import InterpError
from interp.studies.core.regions import regions_from_masks
from interp.studies.objects.lost import corloc_hits
from interp.studies.core.stats import box_iou, iou
from interp.studies.objects.segment import ground_truth_masks


def test_mask_iou_and_the_empty_rule():
    a = torch.zeros(3, 3, dtype=torch.bool)
    a[0] = True
    assert iou(a, a) == 1.0 and iou(a, ~a) == 0.0
    assert iou(a, torch.zeros_like(a)) == 0.0                 # one empty: nothing shared, a real 0
    assert iou(torch.zeros_like(a), torch.zeros_like(a)) is None  # both empty: undefined, not 1 and not 0
    assert iou(a.numpy(), a.numpy()) == 1.0                   # numpy masks too
    with pytest.raises(InterpError, match="shapes"):
        iou(a, a[:2])


def test_box_iou_and_the_empty_rule():
    assert box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert box_iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert box_iou([0, 0, 10, 10], [3, 3, 3, 3]) == 0.0       # one zero-area box
    assert box_iou([3, 3, 3, 3], [5, 5, 5, 9]) is None         # both zero area: undefined
    assert corloc_hits([[3, 3, 3, 3]], [[[5, 5, 5, 9]]], iou=0.0) == [False]  # undefined is no hit


def test_relocation_onto_an_empty_target_is_refused(vit):
    from interp.studies import open_source
    from interp.studies.artifacts.relocate import relocate_study

    src = open_source(model=vit, images=torch.rand(1, 3, 224, 224))
    with pytest.raises(InterpError, match="no cell"):
        relocate_study(src, neurons={0: [1]}, target=torch.zeros(vit.layout.grid, dtype=torch.bool), progress=False)


def _mask(path, size=(8, 6)):
    m = np.zeros(size[::-1], dtype=np.uint8)
    m[:3, :4] = 255
    Image.fromarray(m).save(path)


@pytest.mark.parametrize("suffix", [".png", ".tiff", ".ppm", ".pgm"])
def test_segmentation_and_regions_find_the_same_mask_files(tmp_path, suffix):
    _mask(tmp_path / f"cat{suffix}")
    masks = ground_truth_masks(["/data/cat.jpg", "/data/dog.jpg"], tmp_path)
    assert masks[0] is not None and masks[0].sum() == 12 and masks[1] is None
    cfg = {"input_size": (3, 16, 16), "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center",
           "mean": (0.5,) * 3, "std": (0.5,) * 3}
    regions = regions_from_masks(["/data/cat.jpg"], tmp_path, cfg, (2, 2))
    assert regions.inside[0].any()


def test_two_masks_with_one_stem_are_an_error_for_both_readers(tmp_path):
    _mask(tmp_path / "cat.png")
    (tmp_path / "sub").mkdir()
    _mask(tmp_path / "sub" / "cat.bmp")
    with pytest.raises(InterpError, match="two mask files named 'cat'"):
        ground_truth_masks(["/data/cat.jpg"], tmp_path)
    with pytest.raises(InterpError, match="two mask files named 'cat'"):
        regions_from_masks(["/data/cat.jpg"], tmp_path, {"input_size": (3, 16, 16)}, (2, 2))
