"""Box files: reading CSV / JSON / COCO boxes and matching their image keys to a source's image ids.

Box files (coordinates in pixels of the ORIGINAL image, pixel-edge convention: a box over the whole
``W x H`` image is ``0, 0, W, H``):

* CSV with a header: ``image,x0,y0,x1,y1`` and optional ``width,height`` (the original image size; read
  from the image file when absent). One row per box; a row with empty coordinates lists an image with no box.
* JSON: a list of records ``{"image": "cat/001.jpg", "x0": 10, "y0": 20, "x1": 110, "y1": 90}``
  (optional ``"width"``, ``"height"``; a record without coordinates lists an image with no box), or
  ``{"boxes": [...same records...]}``.
* COCO instances JSON (``images`` + ``annotations``; ``bbox`` is ``[x, y, w, h]``): every annotation is a
  box (crowd ones included, unless read with ``convention="lost"``); images without annotations are listed
  with no box.
* Pascal VOC XML (``Annotations/*.xml``: one ``.xml`` file or a folder of them; ``voc_xml.py``): VOC's 1-based
  inclusive ``xmin ymin xmax ymax`` become pixel edges ``xmin - 1, ymin - 1, xmax, ymax``.

Conventions (``read_boxes(path, convention=...)``): ``"interp"`` (default) reads every box as written;
``"lost"`` applies LOST's ground-truth rules to COCO files (``valeoai/LOST`` ``datasets.py``
``extract_gt_COCO``: crowd annotations, ``iscrowd == 1``, dropped; corners ``x, y, x + w, y + h`` rounded to
whole pixels with Python's ``round``). VOC XML is converted the same way under both (LOST's ``xmin - 1``,
``ymin - 1`` is the pixel-edge conversion); CSV and simple JSON are pixel edges already.

The ``image`` key matches an image path when its path components end the image's path: ``001.jpg`` matches
``/data/val/cat/001.jpg``, and so does ``cat/001.jpg``. A key that matches two images is an error.

>>> table = read_boxes("boxes.csv"); entries = match_boxes(source.ids, table)   # one entry per image
>>> len(entries), entries[0].boxes
(4, [Box(x0=60.0, y0=20.0, x1=200.0, y1=160.0)])
"""
from __future__ import annotations

import csv
import json
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..errors import InterpError, InterpWarning, close_matches
from ..paths import check_input_path
from .box_types import BoxTable, ImageBoxes, _make_box, _normalise_key, _number, check_box_in_image, image_size_of
from .voc_xml import read_voc_xml


CORNERS = ("x0", "y0", "x1", "y1")
RECORD_KEYS = {"image", "width", "height", *CORNERS}  # what a CSV / simple JSON record may hold


def _add_record(table: BoxTable, rec: dict, where: str) -> None:
    if "image" not in rec or rec["image"] in (None, ""):
        raise InterpError(f"{where}: every record needs an 'image' field (the image path or file name)")
    key = _normalise_key(rec["image"])
    entry = table.setdefault(key, ImageBoxes())
    if rec.get("width") not in (None, "") or rec.get("height") not in (None, ""):
        entry.size = image_size_of(rec.get("width"), rec.get("height"), where)
    coords = [rec.get(c) for c in CORNERS]
    if all(c in (None, "") for c in coords):
        others = sorted(str(k) for k, v in rec.items() if k not in RECORD_KEYS and v not in (None, ""))
        if others:  # xmin/ymin/xmax/ymax records were all read as images without a box: pib exited 0 with null
            raise InterpError(f"{where}: no x0, y0, x1, y1 but {', '.join(others[:5])}: name a box's pixel-edge "
                              "corners x0, y0, x1, y1 (or give only image, width, height for an image without one)")
        return  # an image listed without a box
    if any(c in (None, "") for c in coords):
        raise InterpError(f"{where}: give all of x0, y0, x1, y1 (or none, for an image without a box)")
    box = _make_box(*coords, where=where)
    if entry.size is not None:
        check_box_in_image(box, entry.size, where)
    entry.boxes.append(box)


def coco_images(data: dict, path: Path, need_size: bool) -> List[Tuple[object, str, Optional[Tuple[int, int]]]]:
    """``(id, file-name key, (width, height) or None)`` of a COCO JSON's ``images``, each checked (one clear
    line naming the record: missing ``file_name``/``id``, ``width``/``height`` when ``need_size``, bad sizes)."""
    images = data.get("images")
    if not isinstance(images, list):
        raise InterpError(f"{path}: COCO 'images' must be a list of image records, got {type(images).__name__}")
    out = []
    for i, img in enumerate(images):
        where = f"{path}: images[{i}]"
        if not isinstance(img, dict) or not isinstance(img.get("file_name"), str) or "id" not in img:
            raise InterpError(f"{where} needs 'id' and 'file_name' (a string); got {str(img)[:80]}")
        size = None
        if "width" in img or "height" in img or need_size:
            if "width" not in img or "height" not in img:
                raise InterpError(f"{where} ({img['file_name']}) needs 'width' and 'height' (original pixels)")
            size = image_size_of(img["width"], img["height"], where)
        out.append((img["id"], _normalise_key(img["file_name"]), size))
    return out


def coco_annotations(data: dict, path: Path) -> list:
    """The ``annotations`` list of a COCO JSON (checked to be a list of objects)."""
    anns = data.get("annotations")
    if not isinstance(anns, list) or not all(isinstance(a, dict) for a in anns):
        raise InterpError(f"{path}: COCO 'annotations' must be a list of annotation objects, got "
                          f"{type(anns).__name__ if not isinstance(anns, list) else 'a list with non-objects'}")
    return anns


CONVENTIONS = ("interp", "lost")


def _read_coco(data: dict, path: Path, convention: str = "interp") -> BoxTable:
    table: BoxTable = {}
    by_id = {}
    for image_id, key, size in coco_images(data, path, need_size=False):
        table[key] = ImageBoxes(size=size)
        by_id[image_id] = key
    for i, ann in enumerate(coco_annotations(data, path)):
        where = f"{path}: annotation {i}"
        if ann.get("image_id") not in by_id:
            raise InterpError(f"{where} refers to image_id {ann.get('image_id')!r}, not in 'images'")
        bbox = ann.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise InterpError(f"{where}: 'bbox' must be [x, y, width, height], got {bbox!r}")
        x, y, w, h = (_number(v, name, where) for v, name in zip(bbox, ("x", "y", "width", "height")))
        entry = table[by_id[ann["image_id"]]]
        corners = [x, y, x + w, y + h]
        if convention == "lost":
            if ann.get("iscrowd") == 1:
                continue
            corners = [int(round(v)) for v in corners]
            if corners[2] <= corners[0] or corners[3] <= corners[1]:
                continue  # a sub-pixel box rounded to nothing: LOST keeps it, and it can never match
        box = _make_box(*corners, where)
        if entry.size is not None:
            check_box_in_image(box, entry.size, where)
        entry.boxes.append(box)
    return table


def read_boxes(path: Union[str, Path], convention: str = "interp") -> BoxTable:
    """Read a box file (CSV, simple JSON, COCO instances JSON, or VOC XML: one file or a folder of them;
    formats and ``convention`` in the module docstring).

    Returns:
        image key -> :class:`ImageBoxes` (boxes in original pixels).
    """
    if convention not in CONVENTIONS:
        raise InterpError(f"convention={convention!r}: use one of {list(CONVENTIONS)}")
    path = Path(path)
    check_input_path(path, "box file", folder_ok=True)
    if path.is_dir() or path.suffix.lower() == ".xml":
        if not path.exists():
            raise InterpError(f"box file {str(path)!r} does not exist")
        return read_voc_xml(path)
    if not path.is_file():
        raise InterpError(f"box file {str(path)!r} does not exist")
    table: BoxTable = {}
    if path.suffix.lower() == ".csv":
        try:
            with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: a UTF-8 BOM is not part of 'image'
                reader = csv.DictReader(f)
                fields = [(name or "").strip() for name in (reader.fieldnames or [])]
                reader.fieldnames = fields
                missing = {"image", "x0", "y0", "x1", "y1"} - set(fields)
                if missing:
                    raise InterpError(f"{path}: the CSV header must have image,x0,y0,x1,y1 (missing "
                                      f"{sorted(missing)}; found {fields})")
                for line, rec in enumerate(reader, start=2):
                    _add_record(table, {k: rec[k] for k in RECORD_KEYS if k in rec}, f"{path} line {line}")
        except UnicodeDecodeError as e:
            raise InterpError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); save the CSV as UTF-8") from None
        except csv.Error as e:
            raise InterpError(f"{path} is not a readable CSV ({e})") from None
        return _with_a_box(table, path)
    if path.suffix.lower() != ".json":
        raise InterpError(f"box file {str(path)!r}: use a .csv, .json or .xml file, or a folder of VOC .xml files "
                          "(formats: interp.formats.box_files)")
    data = read_json_file(path)
    if isinstance(data, dict) and "images" in data and "annotations" in data:
        return _with_a_box(_read_coco(data, path, convention), path)
    records = data.get("boxes") if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise InterpError(f"{path}: expected a list of box records, {{'boxes': [...]}} or COCO instances JSON")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise InterpError(f"{path}: record {i} is not an object")
        _add_record(table, rec, f"{path} record {i}")
    return _with_a_box(table, path)


def _with_a_box(table: BoxTable, path: Path) -> BoxTable:
    """``table``, refused when it holds no box at all (every study of it would evaluate nothing and say null)."""
    if not any(entry.boxes for entry in table.values()):
        raise InterpError(f"{path}: {len(table)} record(s) and no box; give boxes as x0, y0, x1, y1 (pixel edges)"
                          " per record (formats: interp.formats.box_files)")
    return table


def read_json_file(path: Path):
    """The JSON value of a box or mask file, or one InterpError line (not UTF-8, invalid, nested too deeply)."""
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise InterpError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    except json.JSONDecodeError as e:
        raise InterpError(f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise InterpError(f"{path} is not valid JSON: nested too deeply") from None


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
    _warn_unmatched(ids, out, [k for k in table if tuple(PurePosixPath(k).parts) not in used])
    return out


def _warn_unmatched(ids: Sequence[str], entries: Sequence[Optional[ImageBoxes]], unmatched: Sequence[str]) -> None:
    """Warn when the box file has keys that match no image while some images have no entry: most often a
    misspelt file name, which would silently leave that image out of the scores. (Keys of images not given are
    normal when every given image matched: a box file may cover a whole dataset.)"""
    missing = [image_id for image_id, entry in zip(ids, entries) if entry is None]
    if not unmatched or not missing or len(missing) == len(ids):  # none matched: the callers refuse that
        return
    import warnings

    names = [PurePosixPath(_normalise_key(i)).name for i in missing]
    shown = []
    for key in list(unmatched)[:3]:
        near = close_matches(PurePosixPath(key).name, names, n=1)
        shown.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    warnings.warn(f"{len(missing)} image(s) have no entry in the box file and are left out of the scores, while "
                  f"{len(unmatched)} of its key(s) match no image: {', '.join(shown)}; check the file names",
                  InterpWarning)


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
