"""Images -> model input: timm's own preprocessing (resize, center crop, normalise) for a model."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, List, Sequence, Union

import torch

from ..errors import ImageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")

PathLike = Union[str, Path]


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


def load_images(paths: Union[PathLike, Iterable[PathLike]], model) -> torch.Tensor:
    """Read image files into one batch with the model's preprocessing.

    Args:
        paths: a directory, a list file, or image paths. Any PIL mode is accepted (converted to RGB,
            transparency composited on white).
        model: a ``HookedViT`` or timm ViT; its data config sets size, crop and normalisation.

    Returns:
        Tensor[B, 3, H, W] (float32, on the CPU).
    """
    transform = preprocessing(model)
    files = list_images(paths)
    if not files:
        raise ImageError("no image paths given")
    return torch.stack([transform(open_image(p)) for p in files])
