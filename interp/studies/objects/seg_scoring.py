"""Scoring a binary segmentation against ground truth: per-class IoU and mIoU, per image or over the dataset.

The prediction is class-agnostic (foreground / background), so the classes scored are **background (0) and
foreground (1)**; a ground-truth mask with several classes (VOC's 20) counts every class as foreground. Void
pixels (palette index 255) are left out of both classes, as in the standard semantic-segmentation evaluation
(mmsegmentation's ``intersect_and_union``: pixels whose label is the ignore index are dropped first).

* Per class c: intersection ``I_c = |pred == c & gt == c|`` and union ``U_c = |pred == c | gt == c|`` over the
  scored (non-void) pixels of an image (:func:`class_areas`).
* ``average="image"``: per image, IoU_c = I_c / U_c and the image's mIoU = mean over the classes with U_c > 0;
  the reported mIoU is the mean over images (and each class IoU the mean over images where it is defined).
* ``average="dataset"``: I_c and U_c summed over all scored images first, IoU_c = sum I_c / sum U_c, mIoU = their
  mean over classes with a union (mmsegmentation's ``total_intersect_and_union`` + ``total_area_to_metrics``).

Frames (where the pixels are counted):

* ``"input"``: the model-input frame; the ground truth is mapped into it through the model's resize/crop
  (what the crop removed is not scored).
* ``"full"``: the original image, at the mask's own resolution; each original pixel takes the prediction of
  the input pixel its centre falls on, and pixels the preprocessing cut away count as predicted background
  (with a transform that does not crop, the model saw and is scored on the whole image).

>>> pred = np.array([[1, 1], [0, 0]], dtype=bool)
>>> gt = np.array([[1, 0], [0, 0]], dtype=bool)
>>> inter, union = class_areas(pred, gt)           # [2] and [2]: background, foreground
>>> inter.tolist(), union.tolist()
([2, 1], [3, 2])
>>> round(reduce_areas([(inter, union)], "dataset")["miou"], 4)   # (2/3 + 1/2) / 2
0.5833
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...errors import InterpError
from ...models.inputs.geometry import mask_to_input, mask_to_original
from .configs import AVERAGES, FRAMES

CLASSES = ("background", "foreground")


def class_areas(pred, gt, valid=None) -> Tuple[np.ndarray, np.ndarray]:
    """Per-class (background, foreground) intersection and union pixel counts of bool masks of one shape
    (torch or numpy), over the pixels where ``valid`` (default: all). -> (int64 [2], int64 [2])."""
    pred, gt = np.asarray(pred, dtype=bool), np.asarray(gt, dtype=bool)
    if pred.shape != gt.shape or (valid is not None and np.shape(valid) != pred.shape):
        raise InterpError(f"masks of shapes {pred.shape} and {gt.shape} cannot be compared")
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        pred, gt = pred[valid], gt[valid]
    inter = np.array([np.count_nonzero(~pred & ~gt), np.count_nonzero(pred & gt)], dtype=np.int64)
    union = np.array([np.count_nonzero(~pred | ~gt), np.count_nonzero(pred | gt)], dtype=np.int64)
    return inter, union


def _ious(inter: np.ndarray, union: np.ndarray) -> List[Optional[float]]:
    return [None if u == 0 else float(i) / float(u) for i, u in zip(inter, union)]


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    used = [v for v in values if v is not None]
    return sum(used) / len(used) if used else None


def image_miou(inter: np.ndarray, union: np.ndarray) -> Optional[float]:
    """One image's mIoU: the mean IoU over the classes with a nonzero union (None when no pixel is scored)."""
    return _mean(_ious(inter, union))


def reduce_areas(areas: Sequence[Tuple[np.ndarray, np.ndarray]], average: str = "image") -> Dict:
    """Class IoUs and mIoU of several images' :func:`class_areas` (module docstring for ``average``).

    Returns:
        {"miou": float or None, "class_iou": {"background": ..., "foreground": ...}, "n_images": int}.
    """
    if average not in AVERAGES:
        raise InterpError(f"average={average!r} is not one of {list(AVERAGES)}")
    if average == "dataset":
        inter = sum((a[0] for a in areas), np.zeros(len(CLASSES), dtype=np.int64))
        union = sum((a[1] for a in areas), np.zeros(len(CLASSES), dtype=np.int64))
        per_class = _ious(inter, union)
        miou = _mean(per_class)
    else:
        rows = [_ious(i, u) for i, u in areas]
        per_class = [_mean([r[c] for r in rows]) for c in range(len(CLASSES))]
        miou = _mean([_mean(r) for r in rows])
    return {"miou": miou, "class_iou": dict(zip(CLASSES, per_class)), "n_images": len(areas)}


def upsample_nearest(mask: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """Nearest-neighbour upsampling of a bool [h, w] mask to [H, W]."""
    up = torch.nn.functional.interpolate(mask[None, None].float(), size=tuple(size), mode="nearest")
    return up[0, 0] > 0.5


def score_image(cells: torch.Tensor, foreground: np.ndarray, void: np.ndarray, geometry,
                frame: str = "input") -> Tuple[np.ndarray, np.ndarray, float]:
    """Areas of one image: predicted foreground cells [h, w] against an original-size ground truth
    (foreground and void, bool [H0, W0]) in ``frame``. -> (intersection [2], union [2], share of the
    scored ground-truth pixels the model input does not show: 0 in the input frame)."""
    if frame not in FRAMES:
        raise InterpError(f"frame={frame!r} is not one of {list(FRAMES)}")
    pred_input = upsample_nearest(cells, geometry.input_size).numpy()
    if frame == "input":
        gt = mask_to_input(foreground, geometry).numpy()
        valid = ~mask_to_input(void, geometry).numpy()
        return (*class_areas(pred_input, gt, valid), 0.0)
    pred, seen = mask_to_original(pred_input, geometry)
    valid = ~void
    n_valid = int(valid.sum())
    unseen = float((valid & ~seen).sum()) / n_valid if n_valid else 0.0
    return (*class_areas(pred, foreground, valid), unseen)
