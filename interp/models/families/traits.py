"""What a block's MLP activation computes, and whether a ViT is a CLIP image tower (read from the modules)."""
from __future__ import annotations

from torch import nn


def activation_kind(act: nn.Module) -> str:
    """What an MLP activation module computes, read from its outputs (not its class or the model's name):
    ``"quick_gelu"`` (x * sigmoid(1.702 x), OpenAI CLIP's), ``"gelu"`` (exact erf), ``"gelu_tanh"``, or the
    module's class name for anything else."""
    import torch

    x = torch.linspace(-6.0, 6.0, 241, dtype=torch.float64)
    try:
        with torch.no_grad():
            y = act(x).to(torch.float64)
    except Exception:  # an activation that does not take a plain 1-d tensor
        return type(act).__name__
    kinds = {"quick_gelu": x * torch.sigmoid(1.702 * x),
             "gelu": torch.nn.functional.gelu(x),
             "gelu_tanh": torch.nn.functional.gelu(x, approximate="tanh")}
    for kind, expected in kinds.items():
        if torch.allclose(y, expected, rtol=0, atol=1e-5):
            return kind
    return type(act).__name__


def mlp_activation(model: nn.Module) -> str:
    """The MLP activation of a timm ViT's blocks (:func:`activation_kind`); blocks that disagree give the first
    that differs from block 0 as ``"<kind of block 0> (block i: <kind>)"``."""
    kinds = [activation_kind(block.mlp.act) if hasattr(block.mlp, "act") else type(block.mlp).__name__
             for block in model.blocks]
    odd = next((i for i, k in enumerate(kinds) if k != kinds[0]), None)
    return kinds[0] if odd is None else f"{kinds[0]} (block {odd}: {kinds[odd]})"


def is_clip_tower(model: nn.Module) -> bool:
    """True for a CLIP-style image tower: a timm ViT with a LayerNorm before the blocks (``pre_norm``, open_clip's
    ``ln_pre``), which timm gives only its ``*_clip_*`` (and CLIP-derived ``*_xp_*``) architectures."""
    return isinstance(getattr(model, "norm_pre", None), nn.LayerNorm)
