"""Every image a user may hand interp decodes right (pixel statistics checked) or is refused with one clear error line."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from interp.errors import ImageError, ImageTooLargeError
from interp.models.inputs.preprocessing import check_decodes, open_image, readable_images

from conftest import make_model


# ------------------------------------------------------------------------------------------ images: modes
def _gradient(dtype, high):
    """A 32x32 horizontal gradient 0..high (left to right) of ``dtype``."""
    return np.tile(np.linspace(0, high, 32), (32, 1)).astype(dtype)


def _mode_image(mode: str) -> Image.Image:
    if mode == "I;16":
        return Image.fromarray(_gradient(np.uint16, 65535))
    if mode == "I":
        return Image.fromarray(_gradient(np.int32, 65535))
    if mode == "I-int32-wide":  # int32 TIFF with a range beyond 16 bit: min-max scaled
        return Image.fromarray(_gradient(np.int32, 1_000_000) - 500_000)
    if mode == "F":
        return Image.fromarray(_gradient(np.float32, 1.0))
    if mode == "F-wide":
        return Image.fromarray(_gradient(np.float32, 4000.0))
    gray = Image.fromarray(_gradient(np.uint8, 255))
    if mode == "1":
        return gray.convert("1", dither=Image.Dither.NONE)
    if mode in ("P", "L", "CMYK"):
        return gray.convert(mode)
    if mode == "LA":
        return Image.merge("LA", [gray, Image.new("L", gray.size, 255)])
    if mode == "RGBA":
        return Image.merge("RGBA", [gray, gray, gray, Image.new("L", gray.size, 255)])
    raise AssertionError(mode)


MODES = {  # mode -> (file suffix, expected mean of the decoded 0..255 image, tolerance)
    "I;16": (".png", 127.5, 2.0), "I": (".tif", 127.5, 2.0), "I-int32-wide": (".tif", 127.5, 2.0),
    "F": (".tif", 127.5, 2.0), "F-wide": (".tif", 127.5, 2.0), "P": (".png", 127.5, 3.0),
    "LA": (".png", 127.5, 2.0), "RGBA": (".png", 127.5, 2.0), "L": (".png", 127.5, 2.0),
    "1": (".png", 127.5, 10.0), "CMYK": (".tif", 127.5, 2.0),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_every_pil_mode_decodes_to_its_gradient(tmp_path, mode):
    suffix, mean, tol = MODES[mode]
    path = tmp_path / f"img{suffix}"
    _mode_image(mode).save(path)
    rgb = np.asarray(open_image(path), dtype=np.float64)
    assert rgb.shape == (32, 32, 3)
    assert abs(rgb.mean() - mean) < tol, (mode, Image.open(path).mode, rgb.mean())
    assert rgb.std() > 60  # a gradient, not a blank (white or black) image
    assert rgb[:, :4].mean() < 40 and rgb[:, -4:].mean() > 215  # dark left, bright right
    if mode != "1":  # a gradient through the middle, not a clipped step from black to white
        assert 90 < rgb[:, 12:20].mean() < 165 and rgb[:, 12:20].std() < 40, (mode, rgb[0, 12:20, 0])


def test_sixteen_bit_png_is_not_blank_white(tmp_path):
    path = tmp_path / "depth16.png"
    Image.fromarray(_gradient(np.uint16, 65535)).save(path)
    assert Image.open(path).mode == "I;16"
    assert np.asarray(Image.open(path).convert("RGB")).std() < 60  # what PIL's own convert gives
    assert np.asarray(open_image(path)).std() > 60


def test_transparent_pixels_composite_on_white(tmp_path):
    path = tmp_path / "clear.png"
    Image.new("RGBA", (8, 8), (0, 0, 0, 0)).save(path)
    assert np.asarray(open_image(path)).min() == 255


# ------------------------------------------------------------------------------------------ images: broken
def _truncated_jpeg(path: Path) -> Path:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8)).save(buf, format="JPEG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    return path


def _bomb_png(path: Path) -> Path:
    """A 30000x30000 PNG in about 1 MB (header says 9e8 pixels: over PIL's decompression-bomb limit)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    side = 30000
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit gray
    row = b"\x00" + b"\x00" * (side // 8)
    data = zlib.compress(row * 200, 9)  # only part of the rows: the header alone trips the check
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def test_truncated_jpeg_is_found_up_front_and_skipped(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (16, 16), (10, 20, 30)).save(good)
    bad = _truncated_jpeg(tmp_path / "cut.jpg")
    with Image.open(bad) as im:
        im.verify()  # the header alone looks fine: that is why a header check kept it before
    skipped = []
    with pytest.warns(UserWarning, match="skipped unreadable image"):
        assert readable_images([bad, good], skipped=skipped) == [good]
    assert skipped[0][0] == str(bad) and "truncated" in skipped[0][1]
    with pytest.raises(ImageError, match="strict"):
        readable_images([bad, good], strict=True)


def test_truncated_jpeg_does_not_stop_a_live_study(tmp_path):
    from interp.studies.artifacts.norms import norms_study
    from interp.runtime.open import open_source

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (32, 32), (40 * i, 90, 200)).save(folder / f"ok{i}.png")
    _truncated_jpeg(folder / "cut.jpg")
    model = make_model("vit")
    with pytest.warns(UserWarning, match="skipped unreadable image"):
        source = open_source(model=model, images=folder)
    assert len(source) == 2 and [Path(p).name for p, _ in source.skipped] == ["cut.jpg"]
    result = norms_study(source, progress=False)
    assert result is not None
    with pytest.raises(ImageError):
        open_source(model=model, images=folder, strict=True)


def test_decompression_bomb_is_one_catchable_image_error(tmp_path):
    bomb = _bomb_png(tmp_path / "bomb.png")
    for call in (open_image, check_decodes):
        with pytest.raises(ImageTooLargeError, match="too large to decode safely") as info:
            call(bomb)
        assert isinstance(info.value, ImageError)  # skip-and-record code catches ImageError
    skipped = []
    good = tmp_path / "good.png"
    Image.new("RGB", (8, 8)).save(good)
    with pytest.warns(UserWarning):
        assert readable_images([bomb, good], skipped=skipped) == [good]
    assert "too large" in skipped[0][1]


@pytest.mark.parametrize("content", [b"", b"not an image at all\n", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20])
def test_unreadable_image_files_name_the_file(tmp_path, content):
    path = tmp_path / "broken.png"
    path.write_bytes(content)
    for call in (open_image, check_decodes):
        with pytest.raises(ImageError, match="broken.png"):
            call(path)


def test_cache_skips_a_decompression_bomb_and_its_reader_takes_tensor_lens_keys(tmp_path):
    import interp.cache

    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.new("RGB", (32, 32), (10, 200, 30)).save(folder / "a.png")
    _bomb_png(folder / "bomb.png")
    model = make_model("vit")
    with pytest.warns(UserWarning, match="too large to decode safely"):
        interp.cache.write(model, folder, hooks="blocks.*.hook_resid_post", path=tmp_path / "acts.h5",
                           progress=False)
    with interp.cache.open(tmp_path / "acts.h5") as reader:
        assert [Path(i).name for i in reader.ids] == ["a.png"]
        acts = reader.activation_cache([0])
        assert torch.equal(acts["resid_post", 1], acts["blocks.1.hook_resid_post"])
