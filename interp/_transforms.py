"""The names of the eval transforms (imports nothing, so the command line checks ``--transform`` before torch):
``model`` (timm's own) or ``resize{N}[-crop{M}][-{interpolation}]`` (crop defaults to N)."""
from __future__ import annotations

import re
from typing import Optional, Tuple

MODEL_TRANSFORM = "model"
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
_NAME_RE = re.compile(r"^resize(\d+)(?:-crop(\d+))?(?:-(" + "|".join(INTERPOLATIONS) + r"))?$")
SYNTAX = "'model' (timm's own) or resizeN-cropM, e.g. resize256-crop224"


def parse_transform_name(text: str) -> Optional[Tuple[int, int, Optional[str]]]:
    """``"resize256-crop224"`` -> (256, 224, None); ``"resize224-bilinear"`` -> (224, 224, "bilinear");
    ``"model"`` -> None. Raises ValueError for anything else, or a crop larger than the resize, or a size < 1."""
    name = str(text).strip().lower()
    if name == MODEL_TRANSFORM:
        return None
    m = _NAME_RE.match(name)
    if not m:
        raise ValueError(f"transform {text!r}: use {SYNTAX}")
    resize, crop = int(m.group(1)), int(m.group(2) or m.group(1))
    check_sizes(resize, crop)
    return resize, crop, m.group(3)


def check_sizes(resize: int, crop: int) -> None:
    """Raise ValueError unless 1 <= crop <= resize (the crop must fit in the resized shorter side)."""
    if resize < 1 or crop < 1:
        raise ValueError(f"resize {resize} and crop {crop} must be whole numbers of pixels >= 1")
    if crop > resize:
        raise ValueError(f"crop {crop} is larger than the resized shorter side {resize}: the crop must fit "
                         "(e.g. resize 256, crop 224)")
