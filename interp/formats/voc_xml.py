"""Pascal VOC annotation files (VOC07 / VOC12 ``Annotations/*.xml``) as box tables.

One XML file per image: ``annotation/filename`` names the image (the table key), ``annotation/size`` gives
``width`` / ``height``, and each ``annotation/object/bndbox`` gives ``xmin ymin xmax ymax``. VOC's coordinates
are 1-based pixel indices, both ends inclusive (a box over a whole ``W x H`` image is ``1, 1, W, H``), so the
box in pixel-edge coordinates is ``(xmin - 1, ymin - 1, xmax, ymax)``: the conversion LOST makes
(``valeoai/LOST`` ``datasets.py`` ``extract_gt_VOC``, commit c0ff67ba3baf: ``xmin -= 1``, ``ymin -= 1``).
Objects flagged ``difficult`` or ``truncated`` are kept, as LOST's default run keeps them (only its
``--no_hard`` setting drops them).

The files are parsed with ``xml.etree``; a file with a document type declaration (``<!DOCTYPE``) or an entity
declaration (``<!ENTITY``) is refused before parsing, and so is one over :data:`MAX_XML_BYTES`.

>>> _ = open("000005.xml", "w").write("<annotation><filename>000005.jpg</filename><size><width>500</width>"
...     "<height>375</height></size><object><difficult>0</difficult><bndbox><xmin>263</xmin><ymin>211</ymin>"
...     "<xmax>324</xmax><ymax>339</ymax></bndbox></object></annotation>")
>>> table = read_voc_xml("000005.xml")            # one file, or a folder of them (VOC's Annotations)
>>> table["000005.jpg"].size, table["000005.jpg"].boxes[0]
((500, 375), Box(x0=262.0, y0=210.0, x1=324.0, y1=339.0))
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List, Union

from ..errors import InterpError
from .box_types import BoxTable, ImageBoxes, _make_box, _normalise_key, check_box_in_image, image_size_of

MAX_XML_BYTES = 1_000_000  # a VOC annotation is a few kB
_REFUSED = ("<!DOCTYPE", "<!ENTITY")


def _text(node: ET.Element, tag: str, where: str) -> str:
    child = node.find(tag)
    if child is None or child.text is None or not child.text.strip():
        raise InterpError(f"{where}: missing <{tag}>")
    return child.text.strip()


def _parse(path: Path) -> ET.Element:
    """The root element of one annotation file (refusing DTDs, entities, oversized and malformed files)."""
    if path.stat().st_size > MAX_XML_BYTES:
        raise InterpError(f"{path}: {path.stat().st_size:,} bytes is too large for a VOC annotation file "
                          f"(at most {MAX_XML_BYTES:,})")
    data = path.read_bytes()
    try:  # checked as text, so that another encoding (UTF-16) cannot hide a declaration from the check
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InterpError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); VOC annotations are "
                          "ASCII") from None
    if any(marker in text.upper() for marker in _REFUSED):
        raise InterpError(f"{path}: XML with a DOCTYPE or ENTITY declaration is refused (VOC annotation files "
                          "have none)")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise InterpError(f"{path} is not valid XML ({e})") from None
    if root.tag != "annotation":
        raise InterpError(f"{path}: expected a VOC <annotation> file, found <{root.tag}>")
    return root


def _add_file(table: BoxTable, path: Path) -> None:
    root = _parse(path)
    key = _normalise_key(_text(root, "filename", str(path)))
    if key in table:
        raise InterpError(f"{path}: image {key!r} is annotated twice (two XML files name it)")
    size_node = root.find("size")
    size = None
    if size_node is not None:
        size = image_size_of(_text(size_node, "width", f"{path} <size>"), _text(size_node, "height",
                             f"{path} <size>"), f"{path} <size>")
    entry = table[key] = ImageBoxes(size=size)
    for i, obj in enumerate(root.findall("object")):
        where = f"{path} object {i}"
        bndbox = obj.find("bndbox")
        if bndbox is None:
            raise InterpError(f"{where}: missing <bndbox>")
        xmin, ymin, xmax, ymax = (_text(bndbox, t, where) for t in ("xmin", "ymin", "xmax", "ymax"))
        box = _make_box(*_pixel_edges(xmin, ymin, xmax, ymax, where), where=where)
        if size is not None:
            check_box_in_image(box, size, where)
        entry.boxes.append(box)


def _pixel_edges(xmin: str, ymin: str, xmax: str, ymax: str, where: str) -> List[float]:
    """VOC's 1-based inclusive indices -> pixel edges (xmin - 1, ymin - 1, xmax, ymax)."""
    try:
        x0, y0, x1, y1 = (float(v) for v in (xmin, ymin, xmax, ymax))
    except ValueError:
        raise InterpError(f"{where}: bndbox coordinates must be numbers, got {[xmin, ymin, xmax, ymax]}") from None
    return [x0 - 1, y0 - 1, x1, y1]


def read_voc_xml(path: Union[str, Path]) -> BoxTable:
    """A box table from one VOC annotation file or a folder of them (``*.xml``, not searched recursively).

    Returns:
        ``annotation/filename`` -> :class:`~interp.formats.box_types.ImageBoxes` (pixel-edge boxes,
        the ``<size>`` as the image size).
    """
    path = Path(path)
    files = sorted(p for p in path.glob("*.xml") if p.is_file()) if path.is_dir() else [path]
    if not files:
        raise InterpError(f"{path}: no .xml annotation files in this folder (give VOC's Annotations folder)")
    table: BoxTable = {}
    for f in files:
        _add_file(table, f)
    return table
