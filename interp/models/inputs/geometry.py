"""Where an original image's pixels land in the model input: the geometry of timm's eval transforms (resize,
centre crop or pad, border trim), followed from the transform objects themselves, and masks mapped between the
original image and the input frame (nearest pixel).

Geometry: each box goes through the model's own eval transform (timm's ``Resize`` of the shorter side to
``input / crop_pct`` then ``CenterCrop`` for ``crop_mode="center"``, ``squash`` and ``border`` modes too),
then is clipped to the input.

>>> from interp.models.inputs.preprocessing import data_config, timm_transform
>>> geometry = input_geometry(timm_transform(data_config(model)), (640, 480))   # original (width, height)
>>> geometry.to_input(Box(0, 0, 640, 480))                                        # the centre crop keeps 224 x 224
Box(x0=0.0, y0=0.0, x1=224, y1=224)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from ...errors import InterpError
from ...formats.box_types import Box


@dataclass(frozen=True)
class InputGeometry:
    """Where an original image lands in the model input: ``u = x * scale_x + offset_x``, same for y.

    Attributes:
        image_size: original ``(width, height)``.
        input_size: model input ``(height, width)``.
    """

    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float
    image_size: Tuple[int, int]
    input_size: Tuple[int, int]

    def to_input(self, box: Box) -> Optional[Box]:
        """The box in input pixels, clipped to the input; None when nothing of it is left."""
        h, w = self.input_size
        x0 = min(max(box.x0 * self.scale_x + self.offset_x, 0.0), w)
        x1 = min(max(box.x1 * self.scale_x + self.offset_x, 0.0), w)
        y0 = min(max(box.y0 * self.scale_y + self.offset_y, 0.0), h)
        y1 = min(max(box.y1 * self.scale_y + self.offset_y, 0.0), h)
        if x1 <= x0 or y1 <= y0:
            return None
        return Box(x0, y0, x1, y1)


def _pad_then_center_crop(w: int, h: int, crop_h: int, crop_w: int) -> Tuple[float, float]:
    """Offsets (dx, dy) of torchvision's ``center_crop`` / timm's ``center_crop_or_pad`` (pad first if small)."""
    dx = dy = 0.0
    if crop_w > w or crop_h > h:
        pad_l = (crop_w - w) // 2 if crop_w > w else 0
        pad_t = (crop_h - h) // 2 if crop_h > h else 0
        dx, dy = dx + pad_l, dy + pad_t
        w = w + (crop_w - w if crop_w > w else 0)
        h = h + (crop_h - h if crop_h > h else 0)
        if (w, h) == (crop_w, crop_h):
            return dx, dy
    dx -= int(round((w - crop_w) / 2.0))
    dy -= int(round((h - crop_h) / 2.0))
    return dx, dy


def _resized_size(size, max_size, w: int, h: int) -> Tuple[int, int]:
    """Output (w, h) of torchvision ``Resize(size, max_size)`` (its ``_compute_resized_output_size``)."""
    if isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) == 1):
        requested = size if isinstance(size, int) else size[0]
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = requested, int(requested * long / short)
        if max_size is not None and new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
        return (new_short, new_long) if w <= h else (new_long, new_short)
    return int(size[1]), int(size[0])


def input_geometry(transform, image_size: Tuple[int, int]) -> InputGeometry:
    """Follow a timm eval transform's geometric steps for an image of ``image_size = (width, height)``.

    Handles torchvision ``Resize`` / ``CenterCrop`` and timm ``ResizeKeepRatio`` / ``CenterCropOrPad`` /
    ``TrimBorder``; tensor conversion and normalisation do not move pixels.

    Raises:
        InterpError: a geometric step this function does not know (e.g. a custom transform).
    """
    from timm.data.transforms import CenterCropOrPad, ResizeKeepRatio, TrimBorder
    from torchvision import transforms as T

    w, h = (int(v) for v in image_size)
    sx = sy = 1.0
    ox = oy = 0.0
    for step in getattr(transform, "transforms", [transform]):
        if isinstance(step, T.Resize):
            new_w, new_h = _resized_size(step.size, step.max_size, w, h)
            fx, fy = new_w / w, new_h / h
        elif isinstance(step, ResizeKeepRatio):
            if step.random_scale_prob > 0 or step.random_aspect_prob > 0:
                raise InterpError("the transform resizes at random (a training transform); use the eval transform")
            th, tw = step.size
            ratio_h, ratio_w = h / th, w / tw
            ratio = max(ratio_h, ratio_w) * step.longest + min(ratio_h, ratio_w) * (1.0 - step.longest)
            new_h, new_w = round(h / ratio), round(w / ratio)
            fx, fy = new_w / w, new_h / h
        elif isinstance(step, (T.CenterCrop, CenterCropOrPad)):
            crop_h, crop_w = step.size
            dx, dy = _pad_then_center_crop(w, h, crop_h, crop_w)
            ox, oy = ox + dx, oy + dy
            w, h = crop_w, crop_h
            continue
        elif isinstance(step, TrimBorder):
            top, left = min(step.border_size, h), min(step.border_size, h)  # timm clips left by h too
            ox, oy = ox - left, oy - top
            w, h = max(0, w - 2 * step.border_size), max(0, h - 2 * step.border_size)
            continue
        elif type(step).__name__ in ("ToTensor", "MaybeToTensor", "PILToTensor", "MaybePILToTensor",
                                     "Normalize", "ConvertImageDtype"):
            continue
        else:
            raise InterpError(f"cannot map boxes through the transform step {step!r}; "
                              "interp.models.inputs.geometry.input_geometry knows timm's eval transforms only")
        sx, sy, ox, oy = sx * fx, sy * fy, ox * fx, oy * fy
        w, h = new_w, new_h
    return InputGeometry(sx, sy, ox, oy, tuple(int(v) for v in image_size), (h, w))


def _source_index(n_out: int, scale: float, offset: float) -> np.ndarray:
    """For each of ``n_out`` target pixels, the source pixel under its centre when ``target = source * scale +
    offset`` (floor of ``(i + 0.5 - offset) / scale``)."""
    return np.floor((np.arange(n_out) + 0.5 - offset) / scale).astype(int)


def mask_to_input(mask: np.ndarray, geometry) -> torch.Tensor:
    """An original-size bool mask [H0, W0] -> the model-input frame [H, W]: nearest original pixel under each
    input pixel centre, False where the input shows no original pixel (padding)."""
    h, w = geometry.input_size
    cols = _source_index(w, geometry.scale_x, geometry.offset_x)
    rows = _source_index(h, geometry.scale_y, geometry.offset_y)
    ok_c, ok_r = (cols >= 0) & (cols < mask.shape[1]), (rows >= 0) & (rows < mask.shape[0])
    out = np.zeros((h, w), dtype=bool)
    out[np.ix_(ok_r, ok_c)] = mask[np.ix_(rows[ok_r], cols[ok_c])]
    return torch.from_numpy(out)


def mask_to_original(pred: np.ndarray, geometry) -> Tuple[np.ndarray, np.ndarray]:
    """A model-input-frame bool mask [H, W] -> the original image [H0, W0]: each original pixel takes the input
    pixel its centre lands on. -> (prediction [H0, W0], seen [H0, W0]: the pixel is inside the input; the
    others, cut away by the crop, are predicted background)."""
    w0, h0 = geometry.image_size
    h, w = pred.shape
    # original pixel centre x + 0.5 lands at u = (x + 0.5) * scale + offset: the input pixel floor(u)
    cols = np.floor((np.arange(w0) + 0.5) * geometry.scale_x + geometry.offset_x).astype(int)
    rows = np.floor((np.arange(h0) + 0.5) * geometry.scale_y + geometry.offset_y).astype(int)
    ok_c, ok_r = (cols >= 0) & (cols < w), (rows >= 0) & (rows < h)
    out = np.zeros((h0, w0), dtype=bool)
    out[np.ix_(ok_r, ok_c)] = np.asarray(pred, dtype=bool)[np.ix_(rows[ok_r], cols[ok_c])]
    seen = np.zeros((h0, w0), dtype=bool)
    seen[np.ix_(ok_r, ok_c)] = True
    return out, seen
