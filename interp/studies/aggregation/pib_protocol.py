"""PiB protocol ``"last"``: the LaSt reference's box geometry and filters, exactly (docs/methods.md section 3).

The reference (``ChengShiest/LAST-ViT``, ``visualization/evaluate_patch_hit.py`` ``bbox_to_patch_set`` and
``visualization/imagenet_dataloader.py``) evaluates every model on ``Resize(256)`` (shorter side) +
``CenterCrop(224)``, whatever the model's own ``crop_pct``, and maps a box (original pixels, ``x0, y0, x1,
y1``) onto the grid with this arithmetic:

* ``scale = 256 / min(W, H)``; resized size ``int(W * scale)``, ``int(H * scale)`` (truncated; torchvision's
  own ``Resize`` computes ``int(256 * long / short)``, which can be 1 px larger for a few sizes);
* crop offsets ``(resized - 224) // 2``; box corners ``v * scale - offset`` clipped to ``[0, 224]``;
* cells ``floor(min / p) .. floor(max / p)`` inclusive on each axis, capped at the grid ``224 // p``: every cell
  the clipped box touches, an edge lying exactly on a cell border included (it pulls in the next cell).

Consequences kept on purpose: a box wholly left of / above the crop clips to the edge and counts the first
column / row; a box wholly right of / below the crop gives no cell (the image stays in the denominator).
Filters: exactly one box per image, its area ``(x1 - x0) * (y1 - y0)`` strictly below 25 % of ``W * H``.

>>> sorted(last_box_cells((105, 204, 358, 279), (500, 368)))[:4]   # flat row-major indices on the 14 x 14 grid
[98, 99, 100, 101]
>>> last_keep([(105, 204, 358, 279)], (500, 368))                  # one box, under 25 % of the image
(True, None)
>>> last_keep([(0, 0, 400, 300)], (500, 368))
(False, 'too_large')
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple

import torch

from ...errors import InterpError
from ...models.inputs.preprocessing import EvalTransform

LAST_RESIZE = 256
LAST_CROP = 224
LAST_MAX_BOX_FRACTION = 0.25
# the reference's images: torchvision's Resize(256) (bilinear, shorter side) + CenterCrop(224), the model's
# mean/std; the general eval transform of interp.models.inputs.preprocessing with that interpolation
LAST_PREPROCESS = EvalTransform(LAST_RESIZE, LAST_CROP, "bilinear")


def _xyxy(box) -> Tuple[float, float, float, float]:
    """(x0, y0, x1, y1) from a 4-sequence or an object with x0/y0/x1/y1 attributes (``boxes.Box``)."""
    if hasattr(box, "x0"):
        return float(box.x0), float(box.y0), float(box.x1), float(box.y1)
    x0, y0, x1, y1 = box
    return float(x0), float(y0), float(x1), float(y1)


def last_grid(patch_size: int, crop: int = LAST_CROP) -> int:
    """Cells per side of the protocol's grid (``crop // patch_size``), checked to tile the crop exactly."""
    if patch_size <= 0 or crop % patch_size:
        raise InterpError(f"patch size {patch_size} does not tile the {crop}-px crop of the 'last' protocol; "
                          "use protocol='model' (the model's own transform) for this model")
    return crop // patch_size


def last_box_cells(box, image_wh: Tuple[int, int], patch_size: int = 16, resize: int = LAST_RESIZE,
                   crop: int = LAST_CROP) -> Set[int]:
    """Flat row-major indices of the grid cells a box touches under the reference geometry.

    Args:
        box: ``(x0, y0, x1, y1)`` in original pixels (or a ``boxes.Box``).
        image_wh: original ``(width, height)``.
        patch_size: the model's patch size; the grid is ``crop // patch_size`` per side.
    """
    x0, y0, x1, y1 = _xyxy(box)
    width, height = (int(v) for v in image_wh)
    n = last_grid(patch_size, crop)
    scale = float(resize) / min(width, height)
    left = (int(width * scale) - crop) // 2
    top = (int(height * scale) - crop) // 2

    def clip(v: float) -> float:
        return max(0, min(crop, v))

    cx0, cx1 = clip(x0 * scale - left), clip(x1 * scale - left)
    cy0, cy1 = clip(y0 * scale - top), clip(y1 * scale - top)
    rows = range(int(cy0 // patch_size), min(int(cy1 // patch_size) + 1, n))
    cols = range(int(cx0 // patch_size), min(int(cx1 // patch_size) + 1, n))
    return {r * n + c for r in rows for c in cols}


def last_keep(boxes: Sequence, image_wh: Tuple[int, int],
              max_box_fraction: float = LAST_MAX_BOX_FRACTION) -> Tuple[bool, Optional[str]]:
    """The reference dataloader's filter: ``(keep, reason)``.

    Reasons (as in ``boxes.BOX_REASONS``): ``"no_box"`` (no box listed), ``"several_boxes"`` (more than one),
    ``"too_large"`` (area not strictly below ``max_box_fraction`` of ``W * H``). The reference reads integer
    boxes; other coordinates are used as given.
    """
    if not boxes:
        return False, "no_box"
    if len(boxes) != 1:
        return False, "several_boxes"
    x0, y0, x1, y1 = _xyxy(boxes[0])
    width, height = (int(v) for v in image_wh)
    if not (x1 - x0) * (y1 - y0) < width * height * max_box_fraction:
        return False, "too_large"
    return True, None


def last_regions(boxes_per_image: Sequence[Optional[Sequence]], sizes: Sequence[Tuple[int, int]],
                 patch_size: int, crop: int = LAST_CROP) -> Tuple[torch.Tensor, List[Optional[str]]]:
    """Foreground cells and exclusion reasons of N images under the ``last`` protocol.

    Args:
        boxes_per_image: per image its boxes (None or empty: no box).
        sizes: per image the original ``(width, height)``.

    Returns:
        (inside bool [N, n, n], reasons: None for a kept image, else the :func:`last_keep` reason). A kept
        image whose box maps to no cell keeps an all-False row: it stays in the denominator, as in the reference.
    """
    if len(boxes_per_image) != len(sizes):
        raise InterpError(f"{len(boxes_per_image)} box lists for {len(sizes)} image sizes")
    n = last_grid(patch_size, crop)
    inside = torch.zeros(len(sizes), n, n, dtype=torch.bool)
    reasons: List[Optional[str]] = []
    for i, (boxes, size) in enumerate(zip(boxes_per_image, sizes)):
        keep, reason = last_keep(list(boxes or []), size)
        reasons.append(reason)
        if keep:
            cells = list(last_box_cells(boxes[0], size, patch_size, crop=crop))
            inside[i].view(-1)[cells] = True
    return inside, reasons
