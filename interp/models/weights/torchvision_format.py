"""torchvision's ViT checkpoints (``torchvision.models.vit_b_16`` ...) converted to timm's ViT keys.

torchvision's ``VisionTransformer`` computes what timm's ``VisionTransformer`` (class token, no ``norm_pre``,
pre-norm blocks with LayerNorm eps 1e-6 and exact GELU, final norm, head on the class token) computes; only the
names differ, and torchvision keeps q, k, v in one ``nn.MultiheadAttention`` ``in_proj`` in timm's ``qkv`` order.
The file's own width, depth and patch size are checked against the timm model's, naming the timm architecture
that fits. torchvision normalises with ImageNet's mean/std (timm's ``vit_base_patch16_224`` config: 0.5/0.5), so
the model's data config takes the weights' own transform.
"""
from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ...errors import ModelLoadError
from ..families import family_of

# torchvision name -> (width, depth, patch) and the timm architecture of that shape
TORCHVISION_VITS = {
    "vit_b_16": ((768, 12, 16), "vit_base_patch16_224"),
    "vit_b_32": ((768, 12, 32), "vit_base_patch32_224"),
    "vit_l_16": ((1024, 24, 16), "vit_large_patch16_224"),
    "vit_l_32": ((1024, 24, 32), "vit_large_patch32_224"),
    "vit_h_14": ((1280, 32, 14), "vit_huge_patch14_224"),
}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

_BLOCK = re.compile(r"encoder\.layers\.encoder_layer_(\d+)\.(.+)")
_BLOCK_KEYS = {  # torchvision (both MLP namings: MLPBlock v2 "mlp.0"/"mlp.3", v1 "mlp.linear_1"/"linear_2")
    "ln_1": "norm1", "ln_2": "norm2", "self_attention.in_proj_weight": "attn.qkv.weight",
    "self_attention.in_proj_bias": "attn.qkv.bias", "self_attention.out_proj": "attn.proj",
    "mlp.0": "mlp.fc1", "mlp.linear_1": "mlp.fc1", "mlp.3": "mlp.fc2", "mlp.linear_2": "mlp.fc2",
}
_ROOT_KEYS = {"class_token": "cls_token", "encoder.pos_embedding": "pos_embed", "conv_proj.weight":
              "patch_embed.proj.weight", "conv_proj.bias": "patch_embed.proj.bias", "encoder.ln.weight":
              "norm.weight", "encoder.ln.bias": "norm.bias", "heads.head.weight": "head.weight",
              "heads.head.bias": "head.bias"}


def is_torchvision_vit(state_dict: dict) -> bool:
    return "class_token" in state_dict and "encoder.pos_embedding" in state_dict


def torchvision_shape(state_dict: dict) -> Tuple[int, int, int]:
    """(width, depth, patch) of a torchvision ViT state dict."""
    depth = len({m.group(1) for m in map(_BLOCK.match, state_dict) if m})
    conv = state_dict["conv_proj.weight"]  # [width, 3, patch, patch]
    return int(conv.shape[0]), depth, int(conv.shape[-1])


def model_shape(model: nn.Module) -> Tuple[int, int, int]:
    """(width, depth, patch) of a timm model, read by its family adapter."""
    family = family_of(model)
    return family.d_model(), len(family.blocks()), family.patch_size[-1]


def _describe(shape: Tuple[int, int, int]) -> str:
    return f"width {shape[0]}, {shape[1]} blocks, patch {shape[2]}"


def check_torchvision_shape(state_dict: dict, model: nn.Module, name: str, label: str) -> None:
    """A clear error when the file's width, depth or patch size is not the model's, naming the timm name."""
    held, have = torchvision_shape(state_dict), model_shape(model)
    if held == have:
        return
    known = {shape: (tv, timm_name) for tv, (shape, timm_name) in TORCHVISION_VITS.items()}
    if held in known:
        tv, timm_name = known[held]
        what, fit = f"torchvision's {tv} ({_describe(held)})", f"load it into {timm_name!r}"
    else:
        what, fit = f"a torchvision ViT of {_describe(held)}", (
            f"load it into a timm ViT of that shape (e.g. vit_base_patch{held[2]}_224 with embed_dim={held[0]}, "
            f"depth={held[1]} and its num_heads)")
    raise ModelLoadError(f"{label} holds {what} but {name!r} has {_describe(have)}: {fit}")


def convert_torchvision_vit(state_dict: dict, model: nn.Module, name: str, label: str) -> Dict[str, torch.Tensor]:
    """timm keys for a torchvision ViT state dict (checked against ``model`` first).

    Raises:
        ModelLoadError: another width/depth/patch than ``model``'s, a ``heads.pre_logits`` layer (timm's ViT
            has none), or a key this conversion does not know.
    """
    check_torchvision_shape(state_dict, model, name, label)
    out, unknown = {}, []
    for key, value in state_dict.items():
        m = _BLOCK.match(key)
        if m:
            i, rest = m.groups()
            stem, _, leaf = rest.rpartition(".") if not rest.startswith("self_attention.in_proj") else (rest, "", "")
            mapped = _BLOCK_KEYS.get(stem)
            if mapped is None:
                unknown.append(key)
                continue
            out[".".join(["blocks", i, mapped] + ([leaf] if leaf else []))] = value  # a state-dict key
        elif key in _ROOT_KEYS:
            out[_ROOT_KEYS[key]] = value
        else:
            unknown.append(key)
    if unknown:
        hint = (" (a representation layer before the head, which timm's ViT does not have)"
                if any(k.startswith("heads.pre_logits") for k in unknown) else "")
        raise ModelLoadError(f"{label} is a torchvision ViT with keys interp cannot convert{hint}: "
                             f"{', '.join(unknown[:3])}")
    return out


def adopt_torchvision_config(model: nn.Module, state_dict: dict, fit_head: bool) -> None:
    """The model's head sized to the file's (unless the user gave ``num_classes``: ``fit_head`` False) and its
    data config set to torchvision's: ImageNet mean/std; a 224-px table (IMAGENET1K_V1) with resize 256,
    bilinear, a larger one (SWAG end-to-end) with no crop margin, bicubic."""
    head = state_dict.get("head.weight")
    if fit_head and isinstance(head, torch.Tensor) and int(head.shape[0]) != int(model.num_classes):
        model.reset_classifier(int(head.shape[0]))
    grid = _grid(state_dict)
    width, _, patch = model_shape(model)
    v1 = grid is not None and grid * patch == 224 and width != 1280  # vit_h_14 has no V1 weights
    model.pretrained_cfg = {**(getattr(model, "pretrained_cfg", None) or {}), "mean": IMAGENET_MEAN,
                            "std": IMAGENET_STD, "interpolation": "bilinear" if v1 else "bicubic",
                            "crop_pct": 224 / 256 if v1 else 1.0, "crop_mode": "center"}


def _grid(state_dict: dict) -> Optional[int]:
    pos = state_dict.get("pos_embed")
    n = int(pos.shape[1]) - 1 if isinstance(pos, torch.Tensor) else 0
    side = int(round(n ** 0.5))
    return side if side > 0 and side * side == n else None
