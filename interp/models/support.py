"""Which timm models interp instruments, and a clear error for the others."""
from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModelError

SUPPORTED_FAMILIES = (
    "plain ViT (vit_*_patch*), DeiT-III (deit3_*), DINOv2 (vit_*_dinov2), "
    "DINOv2 with registers (vit_*_reg4_dinov2), CLIP/OpenCLIP image towers (vit_*_clip_*, incl. *_quickgelu_*), "
    "and any other timm VisionTransformer built from standard Block/Attention/Mlp modules"
)


def _block_problem(block: nn.Module) -> str | None:
    from timm.layers import Attention, GluMlp, Mlp, SwiGLU
    from timm.models.vision_transformer import Block

    if type(block) is not Block:
        return f"block type {type(block).__name__} (only timm's vision_transformer.Block is instrumented)"
    if type(block.attn) is not Attention:
        return f"attention type {type(block.attn).__name__} (only timm.layers.Attention)"
    if getattr(block.attn, "gate", None) is not None:
        return "gated attention"
    if type(block.mlp) not in (Mlp, GluMlp, SwiGLU):
        return f"MLP type {type(block.mlp).__name__} (Mlp, GluMlp/SwiGLUPacked or SwiGLU)"
    if isinstance(block.mlp, (Mlp, GluMlp)) and isinstance(block.mlp.fc1, nn.Conv2d):
        return "convolutional MLP"
    return None


def check_supported(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` unless ``model`` is a timm ViT interp can instrument."""
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise UnsupportedModelError(
            f"{type(model).__name__} is not a timm VisionTransformer. interp instruments: {SUPPORTED_FAMILIES}."
        )
    for method in ("forward_features", "_pos_embed", "forward_head", "pool"):
        if getattr(type(model), method) is not getattr(VisionTransformer, method):
            raise UnsupportedModelError(
                f"{type(model).__name__} overrides VisionTransformer.{method} (e.g. distilled DeiT); "
                f"interp instruments: {SUPPORTED_FAMILIES}."
            )
    for i, block in enumerate(model.blocks):
        problem = _block_problem(block)
        if problem:
            raise UnsupportedModelError(
                f"blocks.{i} has an unsupported {problem}. interp instruments: {SUPPORTED_FAMILIES}."
            )


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
