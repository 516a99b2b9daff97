"""The sample photos shipped with interp (public domain / CC0; see interp/data/samples/LICENSE.md)."""
from __future__ import annotations

from pathlib import Path
from typing import List

SAMPLES_DIR = Path(__file__).resolve().parents[2] / "data" / "samples"


def sample_image_paths() -> List[Path]:
    """Paths of the bundled sample photos (astronaut, chelsea, coffee, rocket), sorted."""
    return sorted(SAMPLES_DIR.glob("*.jpg"))
