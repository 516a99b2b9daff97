"""Test oracle: the LaSt PiB ("patch in box") geometry and dataset filters, transcribed from their code.

Follows repo ``ChengShiest/LAST-ViT``:

* ``visualization/evaluate_patch_hit.py``: ``bbox_to_patch_set`` (Resize(256) of the shorter side with
  ``int()`` truncation of the resized size, CenterCrop(224) offsets by floor division, box clipped to
  [0, 224], every cell from ``floor(min / p)`` to ``floor(max / p)`` inclusive, capped at the grid);
* ``visualization/imagenet_dataloader.py``: ``ImageNetValDataset._is_valid_single_object`` (exactly one
  ``<object>``, integer box area strictly below 25 % of the ``<size>`` area) and the default transform
  ``Resize(256), CenterCrop(224)``.

The search index that served these files stores their text without a commit (file ids 52633912519 and
52630356732); the repository at its default branch is the version read. ``bbox_to_patch_set`` hard-codes
256 and 224 in the geometry and uses ``image_size // patch_size`` only for the grid; that is kept. The
dataloader reads the box as integers and hands it to ``bbox_to_patch_set`` as float32 -> Python floats
(exact for integers). Used ONLY as a test oracle, never by the library.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Sequence, Set


def bbox_to_patch_set(bbox: Sequence[float], original_width: int, original_height: int,
                      image_size: int = 224, patch_size: int = 16) -> Set[int]:
    """Flat (row-major) indices of the patch cells the box touches after Resize(256) + CenterCrop(224)."""
    xmin, ymin, xmax, ymax = bbox
    scale = 256.0 / min(original_width, original_height)
    rw = int(original_width * scale)
    rh = int(original_height * scale)
    crop_l = (rw - 224) // 2
    crop_t = (rh - 224) // 2
    xf_min = max(0, min(224, xmin * scale - crop_l))
    yf_min = max(0, min(224, ymin * scale - crop_t))
    xf_max = max(0, min(224, xmax * scale - crop_l))
    yf_max = max(0, min(224, ymax * scale - crop_t))
    n = image_size // patch_size
    indices = set()
    for py in range(int(yf_min // patch_size), min(int(yf_max // patch_size) + 1, n)):
        for px in range(int(xf_min // patch_size), min(int(xf_max // patch_size) + 1, n)):
            indices.add(py * n + px)
    return indices


def is_valid_single_object(xml_text: str) -> bool:
    """``_is_valid_single_object`` on the text of an ImageNet/VOC annotation XML."""
    try:
        root = ET.fromstring(xml_text)
        objects = root.findall("object")
        if len(objects) != 1:
            return False
        size_elem = root.find("size")
        if size_elem is None:
            return False
        img_area = int(size_elem.find("width").text) * int(size_elem.find("height").text)
        bndbox = objects[0].find("bndbox")
        if bndbox is None:
            return False
        xmin, ymin, xmax, ymax = (int(bndbox.find(k).text) for k in ("xmin", "ymin", "xmax", "ymax"))
        return (xmax - xmin) * (ymax - ymin) < img_area * 0.25
    except Exception:
        return False


def annotation_xml(width: int, height: int, boxes: Sequence[Sequence[int]]) -> str:
    """An annotation XML in the ImageNet layout (test helper: the oracle's input format)."""
    objects = "".join(
        f"<object><name>n0</name><bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin><xmax>{b[2]}</xmax>"
        f"<ymax>{b[3]}</ymax></bndbox></object>" for b in boxes)
    return (f"<annotation><size><width>{width}</width><height>{height}</height><depth>3</depth></size>"
            f"{objects}</annotation>")
