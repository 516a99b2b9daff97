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
