"""Box files: reading CSV / JSON / COCO boxes and matching their image keys to a source's image ids.

Box files (coordinates in pixels of the ORIGINAL image, pixel-edge convention: a box over the whole
``W x H`` image is ``0, 0, W, H``):

* CSV with a header: ``image,x0,y0,x1,y1`` and optional ``width,height`` (the original image size; read
  from the image file when absent). One row per box; a row with empty coordinates lists an image with no box.
* JSON: a list of records ``{"image": "cat/001.jpg", "x0": 10, "y0": 20, "x1": 110, "y1": 90}``
  (optional ``"width"``, ``"height"``; a record without coordinates lists an image with no box), or
  ``{"boxes": [...same records...]}``.
* COCO instances JSON (``images`` + ``annotations``; ``bbox`` is ``[x, y, w, h]``): every annotation is a
  box (crowd ones included); images without annotations are listed with no box.

The ``image`` key matches an image path when its path components end the image's path: ``001.jpg`` matches
``/data/val/cat/001.jpg``, and so does ``cat/001.jpg``. A key that matches two images is an error.

>>> table = read_boxes("boxes.csv"); entries = match_boxes(source.ids, table)   # one entry per image
>>> len(entries), entries[0].boxes
(4, [Box(x0=60.0, y0=20.0, x1=200.0, y1=160.0)])
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Sequence, Tuple, Union

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


def _make_box(x0, y0, x1, y1, where: str) -> Box:
    try:
        box = Box(float(x0), float(y0), float(x1), float(y1))
    except (TypeError, ValueError):
        raise InterpError(f"{where}: box coordinates must be numbers, got {[x0, y0, x1, y1]}") from None
    if not (box.x1 > box.x0 and box.y1 > box.y0):
        raise InterpError(f"{where}: a box needs x1 > x0 and y1 > y0 (pixel corners), got {box.as_list()}")
    return box


def _normalise_key(key: str) -> str:
    key = str(key).replace("\\", "/")
    while key.startswith("./"):
        key = key[2:]
    return key


def _add_record(table: BoxTable, rec: dict, where: str) -> None:
    if "image" not in rec:
        raise InterpError(f"{where}: every record needs an 'image' field (the image path or file name)")
    key = _normalise_key(rec["image"])
    entry = table.setdefault(key, ImageBoxes())
    if rec.get("width") not in (None, "") and rec.get("height") not in (None, ""):
        entry.size = (int(float(rec["width"])), int(float(rec["height"])))
    coords = [rec.get(c) for c in ("x0", "y0", "x1", "y1")]
    if all(c in (None, "") for c in coords):
        return  # an image listed without a box
    if any(c in (None, "") for c in coords):
        raise InterpError(f"{where}: give all of x0, y0, x1, y1 (or none, for an image without a box)")
    entry.boxes.append(_make_box(*coords, where=where))


def _read_coco(data: dict, path: Path) -> BoxTable:
    table: BoxTable = {}
    by_id = {}
    for img in data["images"]:
        key = _normalise_key(img["file_name"])
        size = (int(img["width"]), int(img["height"])) if "width" in img and "height" in img else None
        table[key] = ImageBoxes(size=size)
        by_id[img["id"]] = key
    for i, ann in enumerate(data.get("annotations", [])):
        if ann.get("image_id") not in by_id:
            raise InterpError(f"{path}: annotation {i} refers to image_id {ann.get('image_id')!r}, not in 'images'")
        x, y, w, h = ann["bbox"]
        table[by_id[ann["image_id"]]].boxes.append(_make_box(x, y, x + w, y + h, f"{path}: annotation {i}"))
    return table


def read_boxes(path: Union[str, Path]) -> BoxTable:
    """Read a box file (CSV, simple JSON or COCO instances JSON; formats in the module docstring).

    Returns:
        image key -> :class:`ImageBoxes` (boxes in original pixels).
    """
    path = Path(path)
    if not path.is_file():
        raise InterpError(f"box file {str(path)!r} does not exist")
    table: BoxTable = {}
    if path.suffix.lower() == ".csv":
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = {"image", "x0", "y0", "x1", "y1"} - set(reader.fieldnames or [])
            if missing:
                raise InterpError(f"{path}: the CSV header must have image,x0,y0,x1,y1 (missing {sorted(missing)})")
            for line, rec in enumerate(reader, start=2):
                _add_record(table, rec, f"{path} line {line}")
        return table
    if path.suffix.lower() != ".json":
        raise InterpError(f"box file {str(path)!r}: use a .csv or .json file (formats: interp.studies.boxes)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InterpError(f"{path} is not valid JSON: {e}") from None
    if isinstance(data, dict) and "images" in data and "annotations" in data:
        return _read_coco(data, path)
    records = data.get("boxes") if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise InterpError(f"{path}: expected a list of box records, {{'boxes': [...]}} or COCO instances JSON")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise InterpError(f"{path}: record {i} is not an object")
        _add_record(table, rec, f"{path} record {i}")
    return table


def match_boxes(ids: Sequence[str], table: BoxTable) -> List[Optional[ImageBoxes]]:
    """The table entry of each image id (None when the box file does not list it).

    A key matches an id when its path components end the id's path; the longest matching key wins.

    Raises:
        InterpError: a key matches several images (use a longer relative path in the box file).
    """
    by_name: Dict[str, List[Tuple[str, ...]]] = {}
    for key in table:
        parts = PurePosixPath(key).parts
        by_name.setdefault(parts[-1], []).append(parts)
    out: List[Optional[ImageBoxes]] = []
    used: Dict[Tuple[str, ...], str] = {}
    for image_id in ids:
        parts = PurePosixPath(_normalise_key(image_id)).parts
        candidates = [k for k in by_name.get(parts[-1], []) if tuple(parts[-len(k):]) == k]
        if not candidates:
            out.append(None)
            continue
        best = max(candidates, key=len)
        if best in used:
            raise InterpError(f"box file key {'/'.join(best)!r} matches two images ({used[best]!r} and "
                              f"{image_id!r}); write a longer relative path (e.g. class/file.jpg) in the box file")
        used[best] = image_id
        out.append(table["/".join(best)])
    return out


# Mask images: lossless formats only (a JPEG's edges are not 0/1).
MASK_SUFFIXES = (".png", ".bmp", ".gif", ".tif", ".tiff", ".pgm", ".ppm")


def mask_files(mask_dir: Union[str, Path]) -> Dict[str, Path]:
    """Mask files under ``mask_dir`` (searched recursively), by file stem: ``{stem: path}``.

    Raises:
        InterpError: the folder does not exist, or two mask files share a stem (masks are matched to images
            by stem, which must then be unique).
    """
    mask_dir = Path(mask_dir)
    if not mask_dir.is_dir():
        raise InterpError(f"mask directory {str(mask_dir)!r} does not exist")
    files: Dict[str, Path] = {}
    for p in sorted(mask_dir.rglob("*")):
        if p.is_file() and p.suffix.lower() in MASK_SUFFIXES:
            if p.stem in files:
                raise InterpError(f"two mask files named {p.stem!r} under {mask_dir} ({files[p.stem]}, {p}); "
                                  "mask files are matched to images by file stem, which must be unique")
            files[p.stem] = p
    return files


def read_mask(path: Union[str, Path]):
    """A mask image as bool ndarray [H, W] in the original image's pixels: nonzero (any channel, as gray) = foreground."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("L")) > 0
