"""Object boxes (and masks) on the model's patch grid: which patch cells are foreground, and why an image has
none. Box and mask files are read by :mod:`interp.formats`; where an original pixel lands in the model input is
:mod:`interp.models.inputs.geometry`. A patch cell counts as inside when it overlaps the (clipped) box with a positive
area ("touches" the box; a box edge lying exactly on a cell border does not pull in the neighbouring cell).

>>> from interp.models import data_config
>>> from interp.formats.box_files import read_boxes
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
from ...formats.box_files import checked_size, matched_entries
from ...formats.box_types import Box, BoxTable
from ...formats.masks import check_mask_size, mask_files, read_mask
from ...models.inputs.geometry import input_geometry, mask_to_input
from ...models.inputs.preprocessing import timm_transform

BOX_REASONS = ("no_box", "several_boxes", "too_large", "cropped_away")
MASK_REASONS = ("no_mask", "cropped_away")


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


def cell_size(source) -> Tuple[int, int]:
    """Input pixels a side of one cell of ``source.layout.grid`` (the grid studies map): the patch size, or on a
    pyramid model (whose last grid is coarser than its embedding's) the input size / that grid."""
    if not source.layout.stage_grids:
        return tuple(int(p) for p in source.patch_size)
    return tuple(int(s) // int(g) for s, g in zip(source.image_size, source.layout.grid))


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
    transform = timm_transform(data_cfg)
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
    index, void not foreground: :func:`~interp.formats.masks.read_label_mask`). The mask goes
    through the preprocessing geometry (nearest pixel); a cell is inside when any of its input pixels is
    foreground (``cell_rule="touch"``) or more than half of them are (``"majority"``). Images without a mask
    file -> ``no_mask``."""
    _check_cell_rule(cell_rule)
    files = mask_files(mask_dir)
    transform = timm_transform(data_cfg)
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
