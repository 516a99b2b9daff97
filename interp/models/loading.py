"""Build a timm ViT by name, with hub weights or a local weight file.

Offline, ``pretrained=True`` first looks in the local Hugging Face cache; when the weights are not
there it fails at once with a message saying how to pass ``weights=`` or ``pretrained=False``.
"""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Optional, Union

import torch
from torch import nn

from ..errors import ModelLoadError, UnsupportedModelError, close_matches
from .support import SUPPORTED_FAMILIES, check_supported

_VIT_MODULES = ("timm.models.vision_transformer", "timm.models.deit")


def _resolve_dtype(dtype) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
                "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}[str(dtype)]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use float32, float16 or bfloat16") from None


def check_model_name(name: str) -> None:
    """Raise a clear error for an unknown timm name or a timm model that is not a ViT."""
    import timm
    from timm.models import is_model, model_entrypoint

    base = name.split(".")[0]
    if not is_model(base):
        hints = close_matches(base, timm.list_models(), n=5)
        hint = f" Did you mean: {', '.join(hints)}?" if hints else ""
        raise ModelLoadError(f"unknown timm model {name!r}.{hint}")
    module = model_entrypoint(base).__module__
    if module not in _VIT_MODULES:
        raise UnsupportedModelError(
            f"{name!r} is a {module.rsplit('.', 1)[-1]} model, not a ViT. interp instruments: {SUPPORTED_FAMILIES}."
        )


def read_state_dict(path: Union[str, Path]) -> dict:
    """Read a state dict from ``.safetensors``, ``.pth``/``.pt`` or ``.bin`` (unwrapping ``state_dict``/``model`` keys)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"weight file {str(path)!r} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path), device="cpu")
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file
        raise ModelLoadError(f"could not read weight file {str(path)!r}: {e}") from e
    for key in ("state_dict", "model", "module", "teacher"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise ModelLoadError(f"{str(path)!r} does not hold a state dict")
    return sd


def load_weights_file(model: nn.Module, path: Union[str, Path], entry_module: Optional[str] = None) -> None:
    """Load a local state dict into ``model``, applying timm's ``checkpoint_filter_fn`` conversions
    (original DINOv2, OpenAI/OpenCLIP checkpoints, resized position embeddings)."""
    import importlib

    sd = read_state_dict(path)
    module = importlib.import_module(entry_module or "timm.models.vision_transformer")
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    if filter_fn is not None:
        try:
            sd = filter_fn(sd, model)
        except Exception as e:
            raise ModelLoadError(f"timm could not convert {str(path)!r} for this architecture: {e}") from e
    hint = ("Pass the timm name of the architecture these weights were trained with, and timm kwargs "
            "such as num_classes=0 or img_size=... if the head or resolution differs.")
    try:
        result = model.load_state_dict(sd, strict=False)
    except RuntimeError as e:  # shape mismatches
        first = str(e).splitlines()[1:3]
        raise ModelLoadError(f"{str(path)!r} does not match this architecture: {' '.join(first)}. {hint}") from e
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if missing or unexpected:
        raise ModelLoadError(
            f"{str(path)!r} does not match this architecture: {len(missing)} missing keys "
            f"(e.g. {missing[:3]}), {len(unexpected)} unexpected keys (e.g. {unexpected[:3]}). {hint}"
        )


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    ok = []

    def probe():
        try:
            socket.getaddrinfo(host, 443)
            with socket.create_connection((host, 443), timeout=timeout):
                ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)


def _cached_hub_file(model: nn.Module) -> Optional[str]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    repo = cfg.get("hf_hub_id")
    if not repo:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for filename in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin",
                     "open_clip_pytorch_model.bin"):
        found = try_to_load_from_cache(repo, filename)
        if isinstance(found, str):
            return found
    return None


def _offline_message(name: str) -> str:
    return (
        f"cannot download pretrained weights for {name!r}: the Hugging Face hub is unreachable and the "
        "weights are not in the local cache. Either pass a local file, "
        f"interp.load({name!r}, weights='path/to/model.safetensors') "
        f"(CLI: --weights FILE; .safetensors/.pth/.bin; original DINOv2 and OpenAI CLIP files are converted), "
        f"or use random weights with interp.load({name!r}, pretrained=False) (CLI: --no-pretrained)."
    )


def create_timm_vit(
    name: str,
    *,
    pretrained: bool = True,
    weights: Union[str, Path, None] = None,
    device: Union[str, torch.device] = "cpu",
    dtype=None,
    **timm_kwargs,
) -> nn.Module:
    """Build the timm ViT ``name`` in eval mode with the requested weights.

    Args:
        name: timm model name, optionally with a pretrained tag (``vit_small_patch14_dinov2.lvd142m``).
        pretrained: load hub weights (from the local HF cache when offline). Ignored when ``weights`` is given.
        weights: local ``.safetensors``/``.pth``/``.bin`` state dict for this architecture.
        device, dtype: where and in which float type the model lives.
        **timm_kwargs: passed to ``timm.create_model`` (``img_size``, ``dynamic_img_size``, ``num_classes``, ``depth``...).
    """
    import timm
    from timm.models import model_entrypoint

    from .planted import PLANTED_NAME, planted_vit

    if name == PLANTED_NAME:  # the synthetic ground-truth model: its weights are its construction
        if weights is not None:
            raise ModelLoadError(f"{PLANTED_NAME} is built by construction; it takes no weight file")
        model = planted_vit(**timm_kwargs)
        return model.to(device=device, dtype=_resolve_dtype(dtype))
    check_model_name(name)
    try:
        model = timm.create_model(name, pretrained=False, **timm_kwargs)
    except Exception as e:
        raise ModelLoadError(f"timm could not build {name!r} with {timm_kwargs}: {e}") from e
    check_supported(model)
    entry_module = model_entrypoint(name.split(".")[0]).__module__
    if weights is not None:
        load_weights_file(model, weights, entry_module)
    elif pretrained:
        cached = _cached_hub_file(model)
        if cached is not None and not _hub_reachable():
            load_weights_file(model, cached, entry_module)
        elif not _hub_reachable():
            raise ModelLoadError(_offline_message(name))
        else:
            try:
                from timm.models import load_pretrained

                load_pretrained(model, pretrained_cfg=model.pretrained_cfg,
                                num_classes=model.num_classes, filter_fn=getattr(
                                    __import__(entry_module, fromlist=["x"]), "checkpoint_filter_fn", None))
            except Exception as e:
                raise ModelLoadError(_offline_message(name) + f" (hub error: {e})") from e
    model.eval()
    model.to(device=device, dtype=_resolve_dtype(dtype))
    return model
