"""Mask files: foreground masks (and Pascal VOC's palette masks with their void index) in the original image's
pixels, found by file stem in a folder."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Sequence, Union

from ..errors import InterpError
from .box_files import original_size
from .box_types import MAX_IMAGE_PIXELS

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


VOID_INDEX = 255  # palette masks (Pascal VOC): index 255 marks the void border and ambiguous pixels


def read_label_mask(path: Union[str, Path]):
    """A mask image as ``(foreground, void)``, two bool ndarrays [H, W] in the original image's pixels.

    Palette images (PIL mode ``"P"``/``"PA"``, as Pascal VOC's ``SegmentationClass`` PNGs) are read by index:
    0 is background, :data:`VOID_INDEX` (255) is void (neither foreground nor background: not scored) and every
    other index (a class) is foreground. The palette's colours are never looked at (a gray conversion would
    turn VOC's void border into foreground). Other modes: nonzero (any channel, as gray) is foreground, no void.
    """
    import numpy as np
    from PIL import Image

    try:
        with Image.open(path) as im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise InterpError(f"mask {str(path)!r} is {im.width} x {im.height} pixels, more than "
                                  f"{MAX_IMAGE_PIXELS:,}; give masks at the original image size")
            if im.mode in ("P", "PA"):
                index = np.asarray(im.getchannel(0))
                void = index == VOID_INDEX
                return (index != 0) & ~void, void
            gray = np.asarray(im.convert("L")) > 0
            return gray, np.zeros_like(gray)
    except InterpError:
        raise
    except Exception as e:  # PIL raises many types for broken files (text, truncated, bombs)
        raise InterpError(f"cannot read mask {str(path)!r} ({type(e).__name__}: {e}); replace it with a PNG mask "
                          "(nonzero = foreground)") from None


def read_mask(path: Union[str, Path]):
    """A mask image as bool ndarray [H, W] in the original image's pixels: its foreground
    (:func:`read_label_mask`: palette masks by index, void not foreground; other modes nonzero = foreground)."""
    return read_label_mask(path)[0]


def check_mask_size(mask_shape: Sequence[int], image_id: str, what: str) -> None:
    """Refuse a ground-truth mask [H0, W0] whose size is not its image's (when the image file can be read):
    a mask of another size would be mapped through the wrong geometry and scored silently wrong."""
    if not Path(image_id).is_file():
        return
    width, height = original_size(image_id)
    if (int(mask_shape[1]), int(mask_shape[0])) != (width, height):
        raise InterpError(f"{what} is {mask_shape[1]} x {mask_shape[0]} pixels but its image {image_id!r} is "
                          f"{width} x {height}; give each image's mask at the image's own size")
