"""Object boxes (and masks) on the model's patch grid: the preprocessing geometry and regions
(box files are read by ``box_files.py``; its names are importable from here too).

Box files (CSV / JSON / COCO, original-image pixels) and how their image keys match: see ``box_files.py``.

Geometry: each box goes through the model's own eval transform (timm's ``Resize`` of the shorter side to
``input / crop_pct`` then ``CenterCrop`` for ``crop_mode="center"``, ``squash`` and ``border`` modes too),
read from the transform objects themselves, then is clipped to the input. A patch cell counts as inside
when it overlaps the (clipped) box with a positive area ("touches" the box; a box edge lying exactly on a
cell border does not pull in the neighbouring cell).

>>> from interp.models import data_config
>>> table = read_boxes("boxes.csv")
>>> regions = regions_from_boxes(source.ids, table, data_config(model), model.layout.grid, single_object=True)
>>> regions.inside.shape, regions.excluded_counts()     # [N, h, w], images dropped per reason
(torch.Size([4, 14, 14]), {'no_box': 0, 'several_boxes': 0, 'too_large': 0, 'cropped_away': 0})
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ...errors import InterpError
from .box_files import (Box, BoxTable, ImageBoxes, check_box_in_image, mask_files, match_boxes,  # noqa: F401
                        read_boxes, read_mask)  # (re-exported)

BOX_REASONS = ("no_box", "several_boxes", "too_large", "cropped_away")
MASK_REASONS = ("no_mask", "cropped_away")


# ---------------------------------------------------------------------------------------------- geometry
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


def eval_transform(data_cfg: dict):
    """timm's eval transform for a data config (the same call as ``interp.models.preprocessing``)."""
    from timm.data import create_transform

    return create_transform(**data_cfg, is_training=False)


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
                              "interp.studies.objects.boxes.input_geometry knows timm's eval transforms only")
        sx, sy, ox, oy = sx * fx, sy * fy, ox * fx, oy * fy
        w, h = new_w, new_h
    return InputGeometry(sx, sy, ox, oy, tuple(int(v) for v in image_size), (h, w))


CELL_RULES = ("touch", "majority")


def _check_cell_rule(cell_rule: str) -> None:
    if cell_rule not in CELL_RULES:
        raise InterpError(f"cell_rule={cell_rule!r} is not one of {list(CELL_RULES)}")


def box_cells(box: Box, grid: Tuple[int, int], patch_size: Tuple[int, int], cell_rule: str = "touch") -> torch.Tensor:
    """Patch cells of a box (in input pixels) -> bool [h, w]. ``cell_rule``: ``"touch"``, a cell the box overlaps
    with positive area; ``"majority"``, a cell more than half of whose area lies inside the box."""
    _check_cell_rule(cell_rule)
    gh, gw = grid
    ph, pw = patch_size
    if cell_rule == "majority":
        cols, rows = np.arange(gw) * pw, np.arange(gh) * ph
        ox = np.clip(np.minimum(box.x1, cols + pw) - np.maximum(box.x0, cols), 0, None)  # [w] overlap widths
        oy = np.clip(np.minimum(box.y1, rows + ph) - np.maximum(box.y0, rows), 0, None)  # [h] overlap heights
        return torch.from_numpy(oy[:, None] * ox[None, :] > 0.5 * ph * pw)
    mask = torch.zeros(gh, gw, dtype=torch.bool)
    c0, c1 = max(0, math.floor(box.x0 / pw)), min(gw, math.ceil(box.x1 / pw))
    r0, r1 = max(0, math.floor(box.y0 / ph)), min(gh, math.ceil(box.y1 / ph))
    mask[r0:r1, c0:c1] = True
    return mask


def patch_size_of(data_cfg: dict, grid: Tuple[int, int]) -> Tuple[int, int]:
    """Patch size in input pixels: input size / grid (checked to divide exactly)."""
    h, w = (int(v) for v in data_cfg["input_size"][-2:])
    gh, gw = grid
    if h % gh or w % gw:
        raise InterpError(f"input size {h}x{w} is not a whole number of patches of the {gh}x{gw} grid")
    return h // gh, w // gw


def original_size(image_id: str, entry: Optional[ImageBoxes] = None) -> Tuple[int, int]:
    """Original ``(width, height)``: from the box file when it gives it, else from the image file's header."""
    if entry is not None and entry.size is not None:
        return entry.size
    path = Path(image_id)
    if not path.is_file():
        raise InterpError(f"cannot tell the size of image {image_id!r}: the box file gives no width/height "
                          "and the file does not exist; add width,height to the box file")
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.size
    except Exception as e:  # PIL raises many types (unreadable file, decompression bomb)
        raise InterpError(f"cannot read the size of image {image_id!r} ({type(e).__name__}: {e}); add "
                          "width,height to the box file or replace the image") from None


def matched_entries(ids: Sequence[str], table: BoxTable) -> List[Optional[ImageBoxes]]:
    """:func:`match_boxes`, refusing a box file none of whose keys names an image of ``ids`` (a box file for
    other images, or keys that do not end the image paths) instead of an empty evaluation."""
    entries = match_boxes(ids, table)
    if table and ids and all(e is None for e in entries):
        raise InterpError(f"no image matches a key of the box file (keys like {next(iter(table))!r}, images like "
                          f"{ids[0]!r}); box keys must end the image paths, e.g. 'class/file.jpg' or 'file.jpg'")
    return entries


def checked_size(image_id: str, entry: ImageBoxes) -> Tuple[int, int]:
    """The original ``(width, height)`` of an image with boxes (:func:`original_size`), each of its boxes
    checked to lie on it (:func:`check_box_in_image`: a box off the image or reaching far outside it is
    refused)."""
    size = original_size(image_id, entry)
    for b in entry.boxes:
        check_box_in_image(b, size, f"box file entry of {image_id!r}")
    return size


def check_mask_size(mask_shape: Sequence[int], image_id: str, what: str) -> None:
    """Refuse a ground-truth mask [H0, W0] whose size is not its image's (when the image file can be read):
    a mask of another size would be mapped through the wrong geometry and scored silently wrong."""
    if not Path(image_id).is_file():
        return
    width, height = original_size(image_id)
    if (int(mask_shape[1]), int(mask_shape[0])) != (width, height):
        raise InterpError(f"{what} is {mask_shape[1]} x {mask_shape[0]} pixels but its image {image_id!r} is "
                          f"{width} x {height}; give each image's mask at the image's own size")


# ---------------------------------------------------------------------------------------------- regions
@dataclass
class Regions:
    """Foreground patch cells of each image, and why an image has none.

    Attributes:
        inside: bool [N, h, w]; the cells covered by the image's (kept) boxes or mask.
        reasons: per image None (usable) or the exclusion reason (one of ``reason_names``).
        boxes_input: per image the kept boxes in input pixels (clipped), as [x0, y0, x1, y1] lists.
        reason_names: the reasons this kind of region can give (``BOX_REASONS`` or ``MASK_REASONS``).
        cell_rule: how a cell was decided to be inside ("touch" or "majority"; :func:`box_cells`).
    """

    inside: torch.Tensor
    reasons: List[Optional[str]]
    boxes_input: List[List[List[float]]]
    reason_names: Tuple[str, ...] = BOX_REASONS
    cell_rule: str = "touch"

    @property
    def usable(self) -> torch.Tensor:
        """bool [N]: images with a foreground region."""
        return torch.tensor([r is None for r in self.reasons], dtype=torch.bool)

    def excluded_counts(self) -> Dict[str, int]:
        """How many images each reason excluded (every reason listed, zeros included)."""
        counts = {r: 0 for r in self.reason_names}
        for r in self.reasons:
            if r is not None:
                counts[r] += 1
        return counts


def regions_from_boxes(ids: Sequence[str], table: BoxTable, data_cfg: dict, grid: Tuple[int, int], *,
                       single_object: bool = False, max_box_fraction: Optional[float] = None,
                       cell_rule: str = "touch") -> Regions:
    """Map each image's boxes onto the patch grid through the model's preprocessing.

    Filters, in this order: no box listed -> ``no_box``; with ``single_object``, more than one box ->
    ``several_boxes`` (counted over all boxes, before the size filter); boxes larger than
    ``max_box_fraction`` of the original image area are dropped, none left -> ``too_large``; every kept box
    outside the center crop -> ``cropped_away``. The inside cells are the union over the kept boxes.

    Args:
        ids: image ids (paths) of the source, in order.
        table: from :func:`read_boxes`.
        data_cfg: the model's timm data config (``interp.models.data_config(model)`` or a cache's).
        grid: patch grid ``(h, w)``.
        cell_rule: ``"touch"`` (a cell the box overlaps, default) or ``"majority"`` (most of the cell's area
            inside one box); see :func:`box_cells`.
    """
    _check_cell_rule(cell_rule)
    if max_box_fraction is not None and (isinstance(max_box_fraction, bool) or not isinstance(
            max_box_fraction, (int, float)) or not 0 < max_box_fraction <= 1):
        raise InterpError(f"max_box_fraction={max_box_fraction!r}: give a share of the image area in (0, 1] "
                          "(e.g. 0.25), or None to keep every box")
    transform = eval_transform(data_cfg)
    patch = patch_size_of(data_cfg, grid)
    entries = matched_entries(ids, table)
    inside = torch.zeros(len(ids), *grid, dtype=torch.bool)
    reasons: List[Optional[str]] = []
    boxes_input: List[List[List[float]]] = []
    for i, (image_id, entry) in enumerate(zip(ids, entries)):
        kept: List[List[float]] = []
        reason = None
        if entry is None or not entry.boxes:
            reason = "no_box"
        elif single_object and len(entry.boxes) > 1:
            reason = "several_boxes"
        else:
            width, height = checked_size(image_id, entry)
            boxes = entry.boxes
            if max_box_fraction is not None:
                boxes = [b for b in boxes if b.area <= max_box_fraction * width * height]
            if not boxes:
                reason = "too_large"
            else:
                geometry = input_geometry(transform, (width, height))
                mapped = [m for m in (geometry.to_input(b) for b in boxes) if m is not None]
                if not mapped:
                    reason = "cropped_away"
                for m in mapped:
                    inside[i] |= box_cells(m, grid, patch, cell_rule)
                    kept.append(m.as_list())
        reasons.append(reason)
        boxes_input.append(kept)
    return Regions(inside, reasons, boxes_input, cell_rule=cell_rule)


def regions_from_masks(ids: Sequence[str], mask_dir: Union[str, Path], data_cfg: dict,
                       grid: Tuple[int, int], cell_rule: str = "touch") -> Regions:
    """Foreground cells from mask images (``mask_dir/<image stem>.png``, the image's size; palette masks by
    index, void not foreground: :func:`~interp.studies.objects.box_files.read_label_mask`). The mask goes
    through the preprocessing geometry (nearest pixel); a cell is inside when any of its input pixels is
    foreground (``cell_rule="touch"``) or more than half of them are (``"majority"``). Images without a mask
    file -> ``no_mask``."""
    from .seg_scoring import mask_to_input

    _check_cell_rule(cell_rule)
    files = mask_files(mask_dir)
    transform = eval_transform(data_cfg)
    ph, pw = patch_size_of(data_cfg, grid)
    gh, gw = grid
    inside = torch.zeros(len(ids), gh, gw, dtype=torch.bool)
    reasons: List[Optional[str]] = []
    for i, image_id in enumerate(ids):
        path = files.get(Path(image_id).stem)
        if path is None:
            reasons.append("no_mask")
            continue
        mask = read_mask(path)  # [H0, W0]
        check_mask_size(mask.shape, image_id, f"mask {str(path)!r}")
        geometry = input_geometry(transform, (mask.shape[1], mask.shape[0]))
        pixels = mask_to_input(mask, geometry).numpy().reshape(gh, ph, gw, pw)  # outside the image: background
        cells = pixels.any(axis=(1, 3)) if cell_rule == "touch" else pixels.mean(axis=(1, 3)) > 0.5
        inside[i] = torch.from_numpy(cells)
        reasons.append(None if cells.any() else "cropped_away")
    return Regions(inside, reasons, [[] for _ in ids], MASK_REASONS, cell_rule)
