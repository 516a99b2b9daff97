"""Checks on the image batch a ``HookedViT`` is given, with errors that say how to fix the input."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from ..errors import ImageError


def check_image_batch(x: torch.Tensor, timm_model: nn.Module, model_name: str) -> None:
    """Raise :class:`ImageError` unless ``x`` is a Tensor[b, C, H, W] this timm ViT can take.

    ``C`` must be the patch embedding's input channels; ``(H, W)`` the model's own size, or any multiple of
    the patch size for models built with ``dynamic_img_size=True`` (any size with ``dynamic_img_pad``).
    """
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise ImageError(
            f"expected an image batch Tensor[B, C, H, W], got {getattr(x, 'shape', type(x))}; "
            "use interp.load_images(paths, model) to read files"
        )
    pe = timm_model.patch_embed
    in_chans = pe.proj.in_channels
    if x.shape[1] != in_chans:
        raise ImageError(f"model takes {in_chans}-channel images, got {x.shape[1]} channels "
                         "(interp.load_images converts grayscale/RGBA files to RGB)")
    hw = tuple(x.shape[-2:])
    if getattr(timm_model, "dynamic_img_size", False) or not getattr(pe, "strict_img_size", True):
        ph, pw = pe.patch_size
        if not getattr(pe, "dynamic_img_pad", False) and (hw[0] % ph or hw[1] % pw):
            raise ImageError(f"image size {hw} is not a multiple of the patch size {(ph, pw)}")
        return
    size = model_img_size(timm_model)
    if hw != size:
        raise ImageError(
            f"model {model_name} takes {size[0]}x{size[1]} images, got {hw[0]}x{hw[1]}. Resize with "
            "interp.load_images(paths, model) (the model's own preprocessing), or load the model with "
            "dynamic_img_size=True to interpolate position embeddings."
        )


def model_img_size(timm_model: nn.Module) -> Tuple[int, int]:
    """The (H, W) the timm ViT was built for."""
    return tuple(int(s) for s in timm_model.patch_embed.img_size)
