"""One image loop (models.inputs.preprocessing.decode_images) behind load_images and the cache writer's file source:
the same files are kept, the same ones skipped, and strict stops with the same message."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from interp.cache.image_feed import FileImages
from interp.errors import ImageError
from interp.models.inputs.preprocessing import load_images, preprocessing


@pytest.fixture
def folder(tmp_path):
    for name in ("a.png", "c.png"):
        Image.fromarray(np.full((32, 32, 3), 128, np.uint8)).save(tmp_path / name)
    (tmp_path / "b.png").write_bytes(b"not an image")
    return sorted(tmp_path.glob("*.png"))


def test_both_readers_skip_the_same_files_and_stop_alike(folder, vit):
    skipped = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pixels = load_images(folder, vit, skipped=skipped)
    batch = FileImages(folder, preprocessing(vit), (224, 224)).load(0, 3)
    assert pixels.shape[0] == batch.pixels.shape[0] == 2 and batch.positions == [0, 2]
    assert [p for p, _ in skipped] == [i for _, i, _ in batch.skipped] == [str(folder[1])]
    assert skipped[0][1] == batch.skipped[0][2]
    with pytest.raises(ImageError) as live:
        load_images(folder, vit, strict=True)
    with pytest.raises(ImageError) as cached:
        FileImages(folder, preprocessing(vit), (224, 224), strict=True).load(0, 3)
    assert str(live.value) == str(cached.value) and "b.png" in str(live.value) and "strict" in str(live.value)
