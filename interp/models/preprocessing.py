"""Images -> model input: timm's own preprocessing (resize, center crop, normalise) for a model."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ..errors import ImageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")

PathLike = Union[str, Path]


def tensor_image_id(index: int) -> str:
    """The id of image ``index`` of an in-memory Tensor[N, 3, H, W] (no path to name it): ``tensor:<index>``.

    Used by the cache writer (stored in ``/ids``) and by live study sources alike.
    """
    return f"tensor:{index}"


def _timm_module(model):
    return getattr(model, "timm_model", model)


def data_config(model) -> dict:
    """timm's data config (input_size, interpolation, mean, std, crop_pct, crop_mode) for ``model``."""
    from timm.data import resolve_data_config

    timm_model = _timm_module(model)
    cfg = resolve_data_config({}, model=timm_model)
    # The pretrained config may describe another resolution (DINOv2: 518) than the model was built for.
    img_size = getattr(getattr(timm_model, "patch_embed", None), "img_size", None)
    if img_size is not None:
        cfg["input_size"] = (cfg["input_size"][0], int(img_size[0]), int(img_size[1]))
    return cfg


def preprocessing(model):
    """The eval transform (PIL image -> Tensor[3, H, W]) timm uses for ``model``."""
    from timm.data import create_transform

    return create_transform(**data_config(model), is_training=False)


def list_images(source: Union[PathLike, Sequence[PathLike]]) -> List[Path]:
    """Image files of a directory (recursively, sorted), a text file listing paths, or a list of paths."""
    if isinstance(source, (str, Path)):
        source = Path(source)
        if source.is_dir():
            files = sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
            if not files:
                raise ImageError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) under {str(source)!r}")
            return files
        if source.suffix.lower() in (".txt", ".lst"):
            base = source.parent
            lines = [l.strip() for l in source.read_text().splitlines() if l.strip() and not l.startswith("#")]
            return [Path(l) if Path(l).is_absolute() else base / l for l in lines]
        if not source.exists():
            kind = "image file" if source.suffix.lower() in IMAGE_SUFFIXES else "folder or image file"
            raise ImageError(f"{kind} {str(source)!r} does not exist (current folder: {Path.cwd()}); give "
                             "an image folder, a list file (.txt) or image paths")
        return [source]
    return [Path(p) for p in source]


def open_image(path: PathLike):
    """Open an image file as an RGB PIL image (grayscale, palette, RGBA, CMYK... are converted)."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise ImageError(f"image file {str(path)!r} does not exist")
    try:
        with Image.open(path) as im:
            im.load()
            if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                rgba = im.convert("RGBA")
                background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                return Image.alpha_composite(background, rgba).convert("RGB")
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ImageError(f"cannot read image {str(path)!r} ({type(e).__name__}: {e}); "
                         "remove or replace the file") from e


def load_images(paths: Union[PathLike, Iterable[PathLike]], model, strict: bool = False,
                skipped: Optional[List[Tuple[str, str]]] = None) -> torch.Tensor:
    """Read image files into one batch with the model's preprocessing, skipping unreadable files.

    Args:
        paths: a directory, a list file, or image paths. Any PIL mode is accepted (converted to RGB,
            transparency composited on white).
        model: a ``HookedViT`` or timm ViT; its data config sets size, crop and normalisation.
        strict: stop at the first unreadable file (``ImageError`` naming it) instead of skipping it.
        skipped: a list to which ``(path, reason)`` is appended for each skipped file (each also warns once).

    Returns:
        Tensor[B, 3, H, W] (float32, on the CPU) of the readable images, in order (B = files - skipped).

    Raises:
        ImageError: no paths, every file unreadable, or (strict) an unreadable file.
    """
    transform = preprocessing(model)
    files = list_images(paths)
    if not files:
        raise ImageError("no image paths given")
    pixels, reasons = [], []
    for p in files:
        try:
            pixels.append(transform(open_image(p)))
        except ImageError as e:
            if strict:
                raise ImageError(f"{e} (strict: stopped at the first unreadable image)") from e
            reasons.append(str(e))
            skip_image(str(p), str(e), skipped)
    if not pixels:
        raise ImageError(f"none of the {len(files)} image file(s) could be read; first: {reasons[0]}")
    return torch.stack(pixels)


def readable_images(paths: Sequence[PathLike], strict: bool = False,
                    skipped: Optional[List[Tuple[str, str]]] = None) -> List[Path]:
    """The paths that open as images (header read and verified, pixels not decoded: cheap for any number).

    Unreadable ones are skipped (one warning each, ``(path, reason)`` appended to ``skipped``), or with
    ``strict`` the first raises ``ImageError`` naming it. Raises ImageError when none is readable."""
    from PIL import Image

    good, reasons = [], []
    for p in (Path(p) for p in paths):
        try:
            if not p.is_file():
                raise ImageError(f"image file {str(p)!r} does not exist")
            try:
                with Image.open(p) as im:
                    im.verify()
            except Exception as e:  # PIL raises many types for broken files
                raise ImageError(f"cannot read image {str(p)!r} ({type(e).__name__}: {e})") from e
        except ImageError as e:
            if strict:
                raise ImageError(f"{e} (strict: stopped at the first unreadable image)") from e
            reasons.append(str(e))
            skip_image(str(p), str(e), skipped)
            continue
        good.append(p)
    if paths and not good:
        raise ImageError(f"none of the {len(paths)} image file(s) could be read; first: {reasons[0]}")
    return good


def skip_image(image_id: str, reason: str, skipped: Optional[List[Tuple[str, str]]] = None) -> None:
    """Record an unreadable image: one warning line and ``(id, reason)`` appended to ``skipped``."""
    import warnings

    warnings.warn(f"skipped unreadable image: {reason}", stacklevel=3)
    if skipped is not None:
        skipped.append((image_id, reason))
