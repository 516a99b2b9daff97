"""The ViT family: timm's ``VisionTransformer`` (plain ViT, DeiT-III, DINOv2 with and without registers, CLIP and
OpenCLIP image towers incl. QuickGELU), built from timm's ``Block``/``Attention``/``Mlp`` (or ``GluMlp``/SwiGLU).

Blocks are ``blocks.{i}``; tokens are ``[CLS?, registers..., patches...]`` as timm orders them
(``num_prefix_tokens``); LayerScale is ``ls1``/``ls2``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from .parts import KeyValue, attend, head_writes, hook_heads, mlp_forward
from .plain_stack import PlainStackFamily


class VitFamily(PlainStackFamily):
    name = "vit"
    title = ("timm VisionTransformer: plain ViT (vit_*_patch*), DeiT-III (deit3_*), DINOv2 (vit_*_dinov2, "
             "vit_*_reg4_dinov2), CLIP/OpenCLIP image towers (vit_*_clip_*, incl. *_quickgelu_*)")
    timm_modules = ("timm.models.vision_transformer", "timm.models.deit")
    override_example = " (e.g. distilled DeiT: add its family with interp.register_family, docs: Your own model)"

    @classmethod
    def timm_class(cls) -> type:
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer

    def block_types(self) -> Tuple[Tuple[type, ...], Tuple[type, ...]]:
        from timm.layers import Attention
        from timm.models.vision_transformer import Block

        return (Block,), (Attention,)

    def attention_problem(self, attn: nn.Module) -> Optional[str]:
        return "gated attention" if getattr(attn, "gate", None) is not None else None

    # ------------------------------------------------------------------ anatomy
    def attn_gain(self, layer: int) -> Optional[torch.Tensor]:
        return getattr(self.block(layer).ls1, "gamma", None)

    def mlp_gain(self, layer: int) -> Optional[torch.Tensor]:
        return getattr(self.block(layer).ls2, "gamma", None)

    def head_writes(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return head_writes(self.block(layer).attn, self.attn_gain(layer))

    def check_input(self, x: torch.Tensor, model_name: str) -> None:
        """``(H, W)`` must be the model's own size, or any multiple of the patch size for models built with
        ``dynamic_img_size=True`` (any size with ``dynamic_img_pad``)."""
        super().check_input(x, model_name)
        dynamic = getattr(self.module, "dynamic_img_size", False) or not getattr(self.module.patch_embed,
                                                                                 "strict_img_size", True)
        self.check_patch_grid_size(x, model_name, dynamic, "interpolate position embeddings")

    # ------------------------------------------------------------------ hooked forward
    def position(self, patches: torch.Tensor) -> Tuple[torch.Tensor, None]:
        """timm's ``_pos_embed`` (prefix tokens, position embedding), then ``patch_drop``; no RoPE."""
        return self.module.patch_drop(self.module._pos_embed(patches)), None

    def residual_stream(self, hooked, x: torch.Tensor, n_blocks: Optional[int] = None) -> torch.Tensor:
        blocks = self.module.blocks if n_blocks is None else self.module.blocks[:n_blocks]
        h, _ = self.embed(hooked, x)
        extra_kv, force = hooked.edit_state.extra_kv, hooked.force_patterns
        for i, block in enumerate(blocks):
            h = block_forward(block, h, extra_kv.get(i), force)
        return h

    # ------------------------------------------------------------------ plain timm models
    def plain_extra_kv(self, layer: int, kv: KeyValue) -> None:
        block = self.block(layer)
        block.attn = AttentionWithExtraKV(block.attn, *kv)


def attention_forward(attn: nn.Module, x: torch.Tensor, extra_kv: Optional[KeyValue] = None,
                      force_pattern: bool = False, hooked: bool = True) -> torch.Tensor:
    """Hooked forward of ``timm.layers.Attention``: timm's arithmetic op for op, with hook points.

    Args:
        x: [b, t, d] normed residual stream.
        extra_kv: optional (k', v'), each [h, m, dh], appended as m extra key/value columns (not tokens: the
            output keeps t rows). Used by the attention-bias intervention.
        force_pattern: compute scores/pattern even with no hook on them.
        hooked: False for a plain timm ``Attention`` without hook points (patch files run it so).

    Returns:
        [b, t, d] attention output (after ``proj``, before LayerScale).
    """
    B, N, _ = x.shape
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each [b, h, t, dh]
    q, k = attn.q_norm(q), attn.k_norm(k)
    if hooked:
        q, k, v = hook_heads(attn.hook_q, q), hook_heads(attn.hook_k, k), hook_heads(attn.hook_v, v)
    z = attend(attn, q, k, v, extra_kv, force_pattern, hooked)
    out = attn.norm(z.reshape(B, N, attn.attn_dim))
    return attn.proj_drop(attn.proj(out))


def block_forward(block: nn.Module, x: torch.Tensor, extra_kv: Optional[KeyValue] = None,
                  force_pattern: bool = False) -> torch.Tensor:
    """Hooked forward of ``timm.models.vision_transformer.Block``. x: [b, t, d] -> [b, t, d]."""
    resid_pre = block.hook_resid_pre(x)
    attn_out = block.hook_attn_out(
        block.ls1(attention_forward(block.attn, block.norm1(resid_pre), extra_kv, force_pattern)))
    resid_mid = block.hook_resid_mid(resid_pre + block.drop_path1(attn_out))
    mlp_out = block.hook_mlp_out(block.ls2(mlp_forward(block.mlp, block.norm2(resid_mid))))
    return block.hook_resid_post(resid_mid + block.drop_path2(mlp_out))


class AttentionWithExtraKV(nn.Module):
    """Stand-in for a plain timm ``Attention`` that appends (k', v') [h, m, dh] as extra key/value columns: the
    hooked arithmetic (:func:`attention_forward`) without hook points. It adopts the original's children under
    the same names, so the block's ``state_dict`` keys are unchanged."""

    def __init__(self, attn: nn.Module, k_extra: torch.Tensor, v_extra: torch.Tensor):
        super().__init__()
        for name in ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop"):
            self.add_module(name, getattr(attn, name))
        self.num_heads, self.head_dim, self.attn_dim = attn.num_heads, attn.head_dim, attn.attn_dim
        self.scale = attn.scale
        self.register_buffer("k_extra", k_extra.detach().clone(), persistent=False)
        self.register_buffer("v_extra", v_extra.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("AttentionWithExtraKV does not take attention masks")
        return attention_forward(self, x, (self.k_extra, self.v_extra), hooked=False)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, extra_columns={self.k_extra.shape[1]}"
