"""``interp.load``: build a timm ViT and instrument it (a :class:`~interp.hooks.hooked_vit.HookedViT`); its
skeleton, the same model's structure without weights, for the checks before a load."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import torch
from torch import nn

from .hooked_vit import HookedViT
from ..models.weights.hf_folder import check_weights_name, load_hf_folder, resolve_hf_source
from ..models.loading import build_skeleton, create_timm_vit
from ..models.planted import PLANTED_BUILDERS


def load(
    name: str,
    *,
    pretrained: bool = True,
    weights: Union[str, Path, None] = None,
    device: Union[str, torch.device] = "cpu",
    dtype=None,
    seed: Optional[int] = None,
    pos_resample: str = "auto",
    **timm_kwargs,
) -> HookedViT:
    """Build a timm ViT and instrument it.

    Args:
        name: timm model name (``vit_small_patch14_reg4_dinov2``, ``vit_base_patch16_clip_quickgelu_224``...),
            or a Hugging Face ``transformers`` folder (``config.json`` + weights: ``ViTModel``, ``Dinov2Model``,
            ``DINOv3ViTModel``, ``CLIPVisionModel``, ``SiglipVisionModel``...; see
            :mod:`interp.models.weights.hf_folder`) or hub id in the local cache.
        pretrained: hub weights (local HF cache when offline). Offline without cached weights this fails
            at once, saying to pass ``weights=`` or ``pretrained=False``.
        weights: a local ``.safetensors``/``.pth``/``.bin`` state dict; timm's checkpoint conversions
            apply, so original DINOv2 and OpenAI CLIP files load too, and a torchvision ViT file (``vit_b_16``...)
            loads into the timm name of its shape (``vit_base_patch16_224``...); a ``transformers`` folder
            loads as ``name`` would (``name`` must be a timm name of the same family).
        device: where the model runs (default ``"cpu"``; ``"cuda"``, ``"cuda:1"``, ``"mps"``).
        dtype: float type of the weights (default None: timm's float32; ``"float16"``, ``torch.bfloat16``...).
        seed: seed of the random weights (``pretrained=False`` without ``weights``), default 0: the same
            call gives the same weights (and weights fingerprint) in every run; kept as ``model.init_seed``.
        pos_resample: how a position table trained for another size is resampled to ``img_size``: ``"auto"``
            (an original DINOv2 file with DINOv2's own arithmetic, ``"dinov2"`` or ``"dinov2_reg"``; a
            ``transformers`` folder with its class's, :attr:`~interp.models.weights.hf_config.HFSpec.pos_resample`;
            any other weights timm's), ``"timm"``, ``"dinov2"``, ``"dinov2_reg"`` or ``"transformers"``; the method
            used is kept as ``model.pos_resample`` (None when the table was not resampled).
        **timm_kwargs: forwarded to ``timm.create_model`` (``img_size=224``, ``dynamic_img_size=True``,
            ``depth=2`` for quick experiments...).

    Returns:
        HookedViT in eval mode.
    """
    return HookedViT.from_timm(load_timm_module(name, pretrained=pretrained, weights=weights, device=device,
                                                dtype=dtype, seed=seed, pos_resample=pos_resample, **timm_kwargs),
                               name=name)


def load_timm_module(name: str, *, pretrained: bool = True, weights: Union[str, Path, None] = None,
                     device: Union[str, torch.device] = "cpu", dtype=None, seed: Optional[int] = None,
                     pos_resample: str = "auto", **timm_kwargs) -> nn.Module:
    """The plain timm module :func:`load` instruments (same arguments): a ``transformers`` folder or hub id (as
    MODEL or ``weights``) through :func:`~interp.models.weights.hf_folder.load_hf_folder`, anything else through
    :func:`~interp.models.loading.create_timm_vit`."""
    folder = resolve_hf_source(weights) if weights is not None else resolve_hf_source(name)
    if folder is not None:  # a transformers folder (or hub id): its config.json decides the architecture
        if weights is not None:
            check_weights_name(name, folder)
        return load_hf_folder(folder, device=device, dtype=dtype, pos_resample=pos_resample, **timm_kwargs)
    return create_timm_vit(name, pretrained=pretrained, weights=weights, device=device, dtype=dtype, seed=seed,
                           pos_resample=pos_resample, **timm_kwargs)


def load_skeleton(name: str, **timm_kwargs) -> Optional[HookedViT]:
    """The HookedViT of ``load(name, pretrained=False, **timm_kwargs)`` built on torch's meta device: the same
    blocks, hook names and input grid, without a weight read or initialised (~0.03 s for vit_base_patch16_224, see
    :func:`~interp.models.loading.build_skeleton`). Not for running: its tensors hold no values.

    None when no skeleton can be built: a planted model (built by its weights' construction; small and quick to
    build for real) or anything timm or interp refuses on the meta device; the real load then decides, and
    reports its own errors."""
    if name in PLANTED_BUILDERS:
        return None
    try:
        return HookedViT.from_timm(build_skeleton(name, **timm_kwargs), name=name)
    except Exception:  # the skeleton only speeds a refusal up: a failure here never refuses a run
        return None
