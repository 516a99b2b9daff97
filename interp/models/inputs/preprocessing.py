"""Images -> model input: timm's own preprocessing (resize, center crop, normalise) for a model, or a paper's
eval transform (:class:`EvalTransform`: resize the shorter side to N, center-crop M, the model's normalisation).

timm's own transform for DINOv2 built at 224 px resizes the shorter side to 224 and crops nothing more
(``crop_pct`` 1.0); Jiang et al. and the DINOv2 evaluations use resize 256 + center crop 224:

>>> cfg = data_config(model, "resize256-crop224")
>>> cfg["input_size"], cfg["preprocess"], preprocessing(model, cfg["preprocess"]).transforms[0].size
((3, 224, 224), 'resize256-crop224', 256)
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from ...formats.image_files import list_images, readable_image_path
from ..._transforms import INTERPOLATIONS, MODEL_TRANSFORM, check_sizes, parse_transform_name
from ...errors import ImageError, ImageTooLargeError, InterpWarning
from ..families import family_of

PathLike = Union[str, Path]
# the images a run reads: a folder, a .txt/.lst list file, image paths, or a Tensor[N, 3, H, W] of pixels
ImagesSpec = Union[str, Path, Sequence[Union[str, Path]], torch.Tensor]


def tensor_image_id(index: int) -> str:
    """The id of image ``index`` of an in-memory Tensor[N, 3, H, W] (no path to name it): ``tensor:<index>``.

    Used by the cache writer (stored in ``/ids``) and by live study sources alike.
    """
    return f"tensor:{index}"


def _timm_module(model):
    return getattr(model, "timm_model", model)


@dataclass(frozen=True)
class EvalTransform:
    """A paper's eval preprocessing: resize the shorter side to ``resize`` px, center-crop ``crop`` x ``crop``,
    the model's mean/std; ``interpolation`` None = the model's own (timm's data config). Built with timm's own
    transform (so box mapping, which reads the transform, follows it exactly).

    Named ``resize{N}-crop{M}`` (``-bilinear``... when the interpolation is set), e.g. ``resize256-crop224``."""

    resize: int
    crop: int
    interpolation: Optional[str] = None

    def __post_init__(self):
        if not (isinstance(self.resize, int) and isinstance(self.crop, int)):
            raise ImageError(f"resize {self.resize!r} and crop {self.crop!r} must be whole numbers of pixels")
        if self.interpolation is not None and self.interpolation not in INTERPOLATIONS:
            raise ImageError(f"interpolation {self.interpolation!r}: use one of {INTERPOLATIONS}")
        try:
            check_sizes(self.resize, self.crop)
        except ValueError as e:
            raise ImageError(str(e)) from None

    @property
    def name(self) -> str:
        return f"resize{self.resize}-crop{self.crop}" + (f"-{self.interpolation}" if self.interpolation else "")


TransformSpec = Union[None, str, EvalTransform]


def eval_transform(spec: TransformSpec = None, resize: Optional[int] = None,
                   crop: Optional[int] = None) -> Optional[EvalTransform]:
    """The :class:`EvalTransform` of a name (``"resize256-crop224"``, ``"resize224"``: crop = resize; ``"model"``
    or None: timm's own, returned as None) or of ``resize``/``crop`` (crop defaults to the resize)."""
    if isinstance(spec, EvalTransform) or spec is None:
        found = spec
    else:
        try:
            parsed = parse_transform_name(spec)
        except ValueError as e:
            raise ImageError(str(e)) from None
        found = None if parsed is None else EvalTransform(*parsed)
    if resize is None and crop is None:
        return found
    if found is not None:
        raise ImageError(f"give a transform name ({found.name}) or resize/crop, not both")
    if resize is None:
        raise ImageError(f"crop {crop} needs a resize too (e.g. resize 256, crop {crop})")
    return EvalTransform(int(resize), int(resize if crop is None else crop))


def transform_name(config: dict) -> str:
    """The preprocessing a data config describes: an :class:`EvalTransform` name or ``"model"``."""
    return config.get("preprocess") or MODEL_TRANSFORM


def data_config(model, preprocess: TransformSpec = None) -> dict:
    """timm's data config (input_size, interpolation, mean, std, crop_pct, crop_mode) for ``model``; with
    ``preprocess`` (an :class:`EvalTransform` or its name) the one of that transform, which also holds
    ``"preprocess"``: its name.

    Raises:
        ImageError: the transform's crop is not the model's input size and the model takes no other size.
    """
    from timm.data import resolve_data_config

    timm_model = _timm_module(model)
    family = family_of(timm_model)
    cfg = resolve_data_config({}, model=timm_model)
    # The pretrained config may describe another resolution (DINOv2: 518) than the model was built for.
    cfg["input_size"] = (cfg["input_size"][0], *family.img_size)
    t = eval_transform(preprocess)
    if t is None:
        return cfg
    if tuple(cfg["input_size"][1:]) != (t.crop, t.crop) and not family.dynamic_size:
        raise ImageError(f"the {t.name} transform feeds {t.crop} x {t.crop} images but "
                         f"{getattr(model, 'model_name', type(timm_model).__name__)} takes "
                         f"{cfg['input_size'][1]} x {cfg['input_size'][2]}: build it at that size "
                         f"(--img-size {t.crop}) or crop {cfg['input_size'][1]}")
    # timm resizes the shorter side to floor(crop / crop_pct): crop / (resize + 0.5) gives exactly `resize`
    cfg.update(input_size=(cfg["input_size"][0], t.crop, t.crop), crop_pct=t.crop / (t.resize + 0.5),
               crop_mode="center", preprocess=t.name)
    if t.interpolation:
        cfg["interpolation"] = t.interpolation
    return cfg


def timm_transform(data_cfg: dict):
    """timm's eval transform object (PIL image -> Tensor[3, H, W]) for a data config (``data_config(...)``)."""
    from timm.data import create_transform

    return create_transform(**data_cfg, is_training=False)


def preprocessing(model, preprocess: TransformSpec = None):
    """The eval transform (PIL image -> Tensor[3, H, W]) timm uses for ``model``, or ``preprocess``'s."""
    cfg = data_config(model, preprocess)
    cfg.pop("preprocess", None)
    return timm_transform(cfg)


_HIGH_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


def _high_bit_to_l(im):
    """A 16-bit, 32-bit int or float single-channel image -> mode "L" (8 bit), keeping its contrast.

    ``convert("RGB")`` clips these modes at 255, so a 16-bit PNG becomes a blank white image. Scaling:
    ``I;16*`` by 255/65535 (its bit depth); ``I`` (32-bit int) and ``F`` (float) by their value range:
    already 0..255 as is, 0..65535 like 16 bit, float 0..1 times 255, any other range min-max scaled.
    Non-finite float pixels become the darkest value."""
    import numpy as np
    from PIL import Image

    a = np.asarray(im, dtype=np.float64)
    finite = np.isfinite(a)
    if not finite.any():
        raise ValueError(f"every pixel of this {im.mode} image is NaN or infinite")
    low, high = float(a[finite].min()), float(a[finite].max())
    a = np.where(finite, a, low)
    if im.mode.startswith("I;16"):
        a = a * (255.0 / 65535.0)
    elif low >= 0 and high <= 1 and im.mode == "F":
        a = a * 255.0
    elif low >= 0 and high <= 255:
        pass
    elif low >= 0 and high <= 65535 and im.mode == "I":
        a = a * (255.0 / 65535.0)
    else:
        a = (a - low) * (255.0 / (high - low)) if high > low else np.zeros_like(a)
    return Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8))  # 2-D uint8: mode "L"


def to_rgb(im):
    """Any PIL image -> mode "RGB": transparency (RGBA, LA, PA, P with a transparent colour) is composited
    on white, 16-bit/int/float gray scaled to 8 bit (:func:`_high_bit_to_l`), CMYK/YCbCr/1/L/P converted."""
    from PIL import Image

    if im.mode in _HIGH_BIT_MODES:
        im = _high_bit_to_l(im)
    if im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def _open_checked(path: Path):
    """``Image.open`` with PIL's decompression-bomb limit turned into :class:`ImageTooLargeError`."""
    from PIL import Image

    try:
        return Image.open(path)
    except Image.DecompressionBombError as e:
        raise ImageTooLargeError(f"image {str(path)!r} is too large to decode safely ({e}); "
                                 "downscale it or remove it") from e


@contextmanager
def _decoding(path: Path) -> Iterator[None]:
    """Every failure to open or decode ``path`` as one :class:`ImageError` naming the file."""
    readable_image_path(path)  # a FIFO would block the open
    if not path.is_file():
        raise ImageError(f"image file {str(path)!r} does not exist")
    try:
        yield
    except ImageError:
        raise
    except Exception as e:  # PIL raises many types for broken files
        raise ImageError(f"cannot read image {str(path)!r} ({type(e).__name__}: {e}); "
                         "remove or replace the file") from e


def open_image(path: PathLike):
    """Open an image file as an RGB PIL image (any PIL mode is converted, see :func:`to_rgb`).

    Raises:
        ImageTooLargeError: more pixels than PIL's decompression-bomb limit (e.g. a 30000x30000 PNG).
        ImageError: missing, unreadable or truncated file.
    """
    path = Path(path)
    with _decoding(path), _open_checked(path) as im:
        im.load()
        return to_rgb(im)


def check_decodes(path: PathLike) -> None:
    """Raise :class:`ImageError` unless ``path`` is an image whose pixels decode (a truncated JPEG fails
    here, not later in a batch). JPEGs decode at 1/8 scale (every coefficient is still read): cheap."""
    path = Path(path)
    with _decoding(path):
        with _open_checked(path) as im:
            im.verify()
        with _open_checked(path) as im:
            im.draft("RGB", (1, 1))
            im.load()


def load_images(paths: Union[PathLike, Iterable[PathLike]], model, strict: bool = False,
                skipped: Optional[List[Tuple[str, str]]] = None, preprocess: TransformSpec = None) -> torch.Tensor:
    """Read image files into one batch with the model's preprocessing, skipping unreadable files.

    Args:
        paths: a directory, a list file, or image paths. Any PIL mode is accepted (converted to RGB,
            transparency composited on white).
        model: a ``HookedViT`` or timm ViT; its data config sets size, crop and normalisation.
        strict: stop at the first unreadable file (``ImageError`` naming it) instead of skipping it.
        skipped: a list to which ``(path, reason)`` is appended for each skipped file (each also warns once).
        preprocess: a paper's eval transform instead of timm's own (:class:`EvalTransform` or its name,
            e.g. ``"resize256-crop224"``).

    Returns:
        Tensor[B, 3, H, W] (float32, on the CPU) of the readable images, in order (B = files - skipped).

    Raises:
        ImageError: no paths, every file unreadable, or (strict) an unreadable file.
    """
    files = list_images(paths)
    if not files:
        raise ImageError("no image paths given")
    pixels, _, unreadable = decode_images(files, preprocessing(model, preprocess), strict)
    for i, reason in unreadable:
        skip_image(str(files[i]), reason, skipped)
    if not pixels:
        raise ImageError(f"none of the {len(files)} image file(s) could be read; first: {unreadable[0][1]}")
    return torch.stack(pixels)


def decode_images(paths: Sequence[PathLike], transform, strict: bool = False
                  ) -> Tuple[List[torch.Tensor], List[int], List[Tuple[int, str]]]:
    """The one image loop: decode each file (:func:`open_image`) and apply ``transform`` to it.

    Returns:
        (tensors of the readable files, their indices in ``paths``, ``(index, reason)`` of each unreadable one),
        in order. Callers record the unreadable ones their own way (a warning, a cache's ``/skipped``).

    Raises:
        ImageError: with ``strict``, at the first unreadable file, naming it.
    """
    tensors, kept, unreadable = [], [], []
    for i, p in enumerate(paths):
        try:
            tensors.append(transform(open_image(p)))
        except ImageError as e:
            if strict:
                raise type(e)(f"{e} (strict: stopped at the first unreadable image; without strict it is "
                              "skipped and recorded)") from e
            unreadable.append((i, str(e)))
            continue
        kept.append(i)
    return tensors, kept, unreadable


def readable_images(paths: Sequence[PathLike], strict: bool = False,
                    skipped: Optional[List[Tuple[str, str]]] = None) -> List[Path]:
    """The paths whose images decode (:func:`check_decodes`: header verified and pixels decoded, JPEGs at
    1/8 scale), so a truncated file is found here, before any batch, and never shifts later images.

    Unreadable ones are skipped (one warning each, ``(path, reason)`` appended to ``skipped``), or with
    ``strict`` the first raises ``ImageError`` naming it. Raises ImageError when none is readable."""
    good, reasons = [], []
    for p in (Path(p) for p in paths):
        try:
            check_decodes(p)
        except ImageError as e:
            if strict:
                raise type(e)(f"{e} (strict: stopped at the first unreadable image)") from e
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

    warnings.warn(f"skipped unreadable image: {reason}", InterpWarning, stacklevel=3)
    if skipped is not None:
        skipped.append((image_id, reason))


def patch_pixels(images: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
    """Each patch's pixels: images [b, 3, H, W] -> [b, P, 3 * ph * pw] (row-major patches, as timm flattens)."""
    b, c, h, w = images.shape
    gh, gw = grid
    ph, pw = h // gh, w // gw
    return images.reshape(b, c, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * ph * pw)
