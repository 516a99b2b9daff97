"""The box types of the box readers: :class:`Box` (pixel-edge corners), :class:`ImageBoxes` (an image's boxes and
size), ``BoxTable``, and the checks every reader applies to what a file states (finite numbers, ``x1 > x0``,
whole positive image sizes, boxes on their image). Readers: ``box_files.py`` (CSV / JSON / COCO),
``voc_xml.py`` (Pascal VOC XML).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import InterpError


@dataclass(frozen=True)
class Box:
    """An axis-aligned box ``[x0, x1] x [y0, y1]`` in pixel-edge coordinates (x right, y down)."""

    x0: float
    y0: float
    x1: float
    y1: float

    @property
    def area(self) -> float:
        return max(0.0, self.x1 - self.x0) * max(0.0, self.y1 - self.y0)

    def as_list(self) -> List[float]:
        return [self.x0, self.y0, self.x1, self.y1]


@dataclass
class ImageBoxes:
    """The boxes of one image and, when the file gives it, the original image size ``(width, height)``."""

    boxes: List[Box] = field(default_factory=list)
    size: Optional[Tuple[int, int]] = None


BoxTable = Dict[str, ImageBoxes]  # image key (as written in the box file) -> boxes


MAX_IMAGE_PIXELS = 100_000_000  # an image size a box or mask file may state (a mask of it is held in memory)


def _number(value, what: str, where: str) -> float:
    """A finite number from a box/mask file (JSON booleans and text refused: they are not coordinates)."""
    if isinstance(value, bool):
        raise InterpError(f"{where}: {what} must be a number, got the boolean {value}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InterpError(f"{where}: {what} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise InterpError(f"{where}: {what} must be a finite number, got {value!r}")
    return out


def image_size_of(width, height, where: str) -> Tuple[int, int]:
    """A stated original image size ``(width, height)``: whole positive pixel counts, at most
    ``MAX_IMAGE_PIXELS`` pixels. Raises InterpError naming ``where`` otherwise."""
    w, h = _number(width, "width", where), _number(height, "height", where)
    if w < 1 or h < 1 or w != int(w) or h != int(h):
        raise InterpError(f"{where}: width and height must be whole pixel counts >= 1, got {width!r} x {height!r}")
    if w * h > MAX_IMAGE_PIXELS:
        raise InterpError(f"{where}: an image of {int(w)} x {int(h)} pixels is more than {MAX_IMAGE_PIXELS:,} "
                          "pixels; check the width/height (they are the original image's size in pixels)")
    return int(w), int(h)


def _make_box(x0, y0, x1, y1, where: str) -> Box:
    box = Box(*(_number(v, name, where) for v, name in ((x0, "x0"), (y0, "y0"), (x1, "x1"), (y1, "y1"))))
    if not (box.x1 > box.x0 and box.y1 > box.y0):
        raise InterpError(f"{where}: a box needs x1 > x0 and y1 > y0 (pixel corners), got {box.as_list()}")
    return box


def check_box_in_image(box: Box, size: Tuple[int, int], where: str) -> None:
    """Refuse a box that misses its ``(width, height)`` image or reaches far outside it (more than half the
    image beyond an edge: coordinates in other units, or crafted), instead of a silently empty region."""
    w, h = size
    if box.x1 <= 0 or box.y1 <= 0 or box.x0 >= w or box.y0 >= h:
        raise InterpError(f"{where}: box {box.as_list()} lies outside its {w} x {h} image; box coordinates are "
                          "pixels of the original image (x0, y0, x1, y1)")
    if box.x0 < -w / 2 or box.y0 < -h / 2 or box.x1 > 1.5 * w or box.y1 > 1.5 * h:
        raise InterpError(f"{where}: box {box.as_list()} reaches far outside its {w} x {h} image; box coordinates "
                          "are pixels of the original image (x0, y0, x1, y1)")


def _normalise_key(key: str) -> str:
    key = str(key).replace("\\", "/")
    while key.startswith("./"):
        key = key[2:]
    return key
