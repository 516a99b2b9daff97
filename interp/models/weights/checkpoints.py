"""Fine-tuned and training-framework checkpoints: the weights inside a training run's file, and the head a
fine-tune gave the model.

A training script saves more than a state dict: ``{"epoch", "optimizer", "state_dict", "state_dict_ema"}``
(timm's train.py), ``{"model": ...}`` (DeiT, MAE, DINOv2's trainer), ``{"teacher", "student"}`` (DINO), keys
prefixed ``module.`` (DataParallel / DDP) or ``_orig_mod.`` (``torch.compile``). :func:`unwrap_checkpoint` takes the
weights out and says in one line what it took and stripped. :func:`fit_head_classes` sizes the model's classifier
to the file's (a fine-tune on another number of classes, or a file without a head).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

# nested containers of the weights, tried in this order at each level (the model's own weights before EMA ones)
CONTAINERS = ("state_dict", "model", "module", "teacher")
EMA_CONTAINERS = ("state_dict_ema", "model_ema", "ema_state_dict", "ema_model", "ema")
# prefixes a wrapper puts on every key: DataParallel / DDP, torch.compile, a Lightning module's attribute
KEY_PREFIXES = ("module.", "_orig_mod.", "model.")


def unwrap_checkpoint(obj: Any) -> Tuple[Any, Optional[str]]:
    """(the state dict inside ``obj``, a one-line note of what was taken and stripped, or None when ``obj`` was a
    plain state dict). Non-dict values are returned as they are (the caller refuses them)."""
    taken: List[str] = []
    ema_left: List[str] = []
    while isinstance(obj, dict):
        key = next((k for k in CONTAINERS if isinstance(obj.get(k), dict)), None)
        if key is None:
            key = next((k for k in EMA_CONTAINERS if isinstance(obj.get(k), dict)), None)
        elif not ema_left:
            ema_left = [k for k in EMA_CONTAINERS if isinstance(obj.get(k), dict)]
        if key is None:
            break
        taken.append(key)
        obj = obj[key]
    stripped: List[str] = []
    while isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        prefix = next((p for p in KEY_PREFIXES if all(k.startswith(p) for k in obj)), None)
        if prefix is None:
            break
        stripped.append(prefix)
        obj = {k[len(prefix):]: v for k, v in obj.items()}
    if isinstance(obj, dict):  # optimizer steps, epochs and the like beside the tensors: not weights
        obj = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)} if any(
            isinstance(v, torch.Tensor) for v in obj.values()) else obj
    if not taken and not stripped:
        return obj, None
    parts = []
    if taken:
        what = "EMA weights" if taken[-1] in EMA_CONTAINERS else "weights"
        parts.append(f"took the {what} under {'/'.join(repr(k) for k in taken)}")
    if ema_left:
        parts.append(f"left the EMA weights under {ema_left[0]!r}")
    if stripped:
        parts.append(f"stripped {' and '.join(repr(p) for p in stripped)} from every key")
    return obj, "; ".join(parts)


def _classifier_prefix(model: nn.Module) -> Optional[str]:
    """The state-dict prefix of the model's classifier (``head``, ``head.fc``...), None when it has none."""
    get = getattr(model, "get_classifier", None)
    if get is None or not hasattr(model, "reset_classifier"):
        return None
    head = get()
    head = head[0] if isinstance(head, tuple) else head  # distilled DeiT: (head, head_dist)
    return next((name for name, module in model.named_modules() if module is head and name), None)


def fit_head_classes(model: nn.Module, state_dict: Dict[str, torch.Tensor]) -> Optional[str]:
    """Size the model's classifier to the file's: a fine-tune's ``head.weight`` [C, d] with another C, or a
    timm-layout file without a head (``num_classes=0``). Returns what it did in a few words, None when the head
    already fits (or the file's layout does not say: another format's keys)."""
    prefix = _classifier_prefix(model)
    if prefix is None or "patch_embed.proj.weight" not in state_dict:  # not a timm-layout file
        return None
    weight = state_dict.get(f"{prefix}.weight")
    have = int(getattr(model, "num_classes", 0) or 0)
    if weight is None:
        if have and not any(k.startswith(prefix + ".") for k in state_dict):
            model.reset_classifier(0)
            return f"holds no classifier ({prefix}.weight): built without one (num_classes=0, not {have})"
        return None
    if weight.dim() != 2 or int(weight.shape[0]) == have:
        return None
    n = int(weight.shape[0])
    model.reset_classifier(n)
    return f"holds a {n}-class head ({prefix}.weight {list(weight.shape)}): built with num_classes={n}, not {have}"
