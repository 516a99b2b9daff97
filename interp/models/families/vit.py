"""The ViT family: timm's ``VisionTransformer`` (plain ViT, DeiT-III, DINOv2 with and without registers, CLIP and
OpenCLIP image towers incl. QuickGELU), built from timm's ``Block``/``Attention``/``Mlp`` (or ``GluMlp``/SwiGLU).

Blocks are ``blocks.{i}``; tokens are ``[CLS?, registers..., patches...]`` as timm orders them
(``num_prefix_tokens``); LayerScale is ``ls1``/``ls2``.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from ...errors import InterpError
from ..layout import TokenLayout
from .base import Family
from .parts import (InsertExtraTokens, KeyValue, MlpActivationEdits, attend, head_writes, hook_heads, install, is_gated,
                    mlp_forward, unsupported_mlp)
from .readout import FinalReadout, final_readout

_ENTRY_POINTS = ("forward_features", "_pos_embed", "forward_head", "pool")


class VitFamily(Family):
    name = "vit"
    title = ("timm VisionTransformer: plain ViT (vit_*_patch*), DeiT-III (deit3_*), DINOv2 (vit_*_dinov2, "
             "vit_*_reg4_dinov2), CLIP/OpenCLIP image towers (vit_*_clip_*, incl. *_quickgelu_*)")
    timm_modules = ("timm.models.vision_transformer", "timm.models.deit")

    @classmethod
    def timm_class(cls) -> type:
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer

    def check(self) -> None:
        from timm.layers import Attention
        from timm.models.vision_transformer import Block

        # the entry points of the class this family instruments (a subclass family, e.g. one added with
        # interp.register_family, names its own class)
        self.refuse_overrides(self.timm_class(), _ENTRY_POINTS, " (e.g. distilled DeiT: add its family with "
                                                                "interp.register_family, docs: Your own model)")
        for i, block in enumerate(self.module.blocks):
            problem = None
            if type(block) is not Block:
                problem = f"block type {type(block).__name__} (only timm's vision_transformer.Block)"
            elif type(block.attn) is not Attention:
                problem = f"attention type {type(block.attn).__name__} (only timm.layers.Attention)"
            elif getattr(block.attn, "gate", None) is not None:
                problem = "gated attention"
            else:
                problem = unsupported_mlp(block.mlp)
            if problem:
                raise self.unsupported(f"blocks.{i} has an unsupported {problem}")

    # ------------------------------------------------------------------ anatomy
    def block(self, layer: int) -> nn.Module:
        return self.module.blocks[layer]

    def grid(self, img_size: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
        """Patch grid ``(h, w)`` for an input of ``img_size`` (default: the model's own)."""
        pe = self.module.patch_embed
        if img_size is None:
            return tuple(int(g) for g in pe.grid_size)
        if hasattr(pe, "dynamic_feat_size"):
            return tuple(int(g) for g in pe.dynamic_feat_size(tuple(img_size)))
        ph, pw = pe.patch_size
        return (img_size[0] // ph, img_size[1] // pw)

    def layout(self, img_size: Optional[Tuple[int, int]] = None) -> TokenLayout:
        m = self.module
        return TokenLayout(n_prefix=int(getattr(m, "num_prefix_tokens", 0)),
                           n_registers=int(getattr(m, "num_reg_tokens", 0) or 0),
                           cls_index=0 if getattr(m, "cls_token", None) is not None else None,
                           grid=self.grid(img_size))

    def d_model(self, layer: int = -1) -> int:
        return int(self.module.embed_dim)

    def attn_gain(self, layer: int) -> Optional[torch.Tensor]:
        return getattr(self.block(layer).ls1, "gamma", None)

    def mlp_gain(self, layer: int) -> Optional[torch.Tensor]:
        return getattr(self.block(layer).ls2, "gamma", None)

    def final_readout(self) -> FinalReadout:
        return final_readout(self)

    def head_writes(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return head_writes(self.block(layer).attn, self.attn_gain(layer))

    def check_input(self, x: torch.Tensor, model_name: str) -> None:
        """``(H, W)`` must be the model's own size, or any multiple of the patch size for models built with
        ``dynamic_img_size=True`` (any size with ``dynamic_img_pad``)."""
        super().check_input(x, model_name)
        dynamic = getattr(self.module, "dynamic_img_size", False) or not getattr(self.module.patch_embed,
                                                                                 "strict_img_size", True)
        self.check_patch_grid_size(x, model_name, dynamic, "interpolate position embeddings")

    # ------------------------------------------------------------------ hook points
    def hook_leaves(self, layer: int) -> Tuple[str, ...]:
        leaves = super().hook_leaves(layer)
        if is_gated(self.mlp(layer)):
            i = leaves.index("mlp.hook_post")
            leaves = leaves[:i] + ("mlp.hook_gate",) + leaves[i:]
        return leaves

    def install(self) -> None:
        for i, (_, block) in enumerate(self.blocks()):
            install(block, extra_mlp=("hook_gate",) if is_gated(block.mlp) else ())

    # ------------------------------------------------------------------ hooked forward
    def embed(self, hooked, x: torch.Tensor) -> torch.Tensor:
        """Images [b, C, H, W] -> tokens [b, t, d] entering block 0: patch embedding (``hook_patch_embed``),
        prefix tokens and position embedding, test-time registers, ``norm_pre`` (``hook_embed``)."""
        m = self.module
        e = m.patch_embed(x)
        if e.ndim == 4:  # dynamic_img_size: [b, h, w, d]; the hook sees it flattened
            b, h, w, d = e.shape
            e = hooked.hook_patch_embed(e.reshape(b, h * w, d)).reshape(b, h, w, d)
        else:
            e = hooked.hook_patch_embed(e)
        tokens = m.patch_drop(m._pos_embed(e))
        n_extra = hooked.edit_state.n_extra_tokens
        if n_extra:
            n_prefix = m.num_prefix_tokens
            zeros = tokens.new_zeros(tokens.shape[0], n_extra, tokens.shape[-1])
            tokens = torch.cat([tokens[:, :n_prefix], zeros, tokens[:, n_prefix:]], dim=1)
        return hooked.hook_embed(m.norm_pre(tokens))

    def residual_stream(self, hooked, x: torch.Tensor, n_blocks: Optional[int] = None) -> torch.Tensor:
        blocks = self.module.blocks if n_blocks is None else self.module.blocks[:n_blocks]
        h = self.embed(hooked, x)
        extra_kv, force = hooked.edit_state.extra_kv, hooked.force_patterns
        for i, block in enumerate(blocks):
            h = block_forward(block, h, extra_kv.get(i), force)
        return h

    def forward_features(self, hooked, x: torch.Tensor) -> torch.Tensor:
        return hooked.hook_norm_final(self.module.norm(self.residual_stream(hooked, x)))

    def pool(self, hooked, tokens: torch.Tensor) -> torch.Tensor:
        """Normed tokens [b, t, d] -> pooled [b, d']: timm's own ``pool`` unless an edit is active.

        With a pooling override (``SelectiveCLS``) it gets the patch tokens and its votes go to
        ``hook_selective_votes``; with test-time registers timm's pooling runs with them counted as prefix
        tokens (so they stay out of patch averages).
        """
        from timm.layers import global_pool_nlc

        m, state = self.module, hooked.edit_state
        if state.pool_override is None and not state.n_extra_tokens:
            return m.pool(tokens)
        n_prefix = m.num_prefix_tokens + state.n_extra_tokens
        if state.pool_override is not None:
            pooled, votes = state.pool_override(tokens[:, n_prefix:])
            if votes is not None:
                hooked.hook_selective_votes(votes)
            return pooled
        if m.attn_pool is not None:
            return m.attn_pool(tokens if m.pool_include_prefix else tokens[:, n_prefix:])
        return global_pool_nlc(tokens, pool_type=m.global_pool, num_prefix_tokens=n_prefix,
                               reduce_include_prefix=m.pool_include_prefix)

    def forward_head(self, hooked, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """timm's order: pool, ``fc_norm`` (-> ``hook_pooled``), ``head_drop``, ``head`` (-> ``hook_logits``)."""
        m = self.module
        pooled = m.head_drop(hooked.hook_pooled(m.fc_norm(self.pool(hooked, tokens))))
        return pooled if pre_logits else hooked.hook_logits(m.head(pooled))

    # ------------------------------------------------------------------ plain timm models
    def plain_mlp_edits(self, layer: int, edits: Sequence[nn.Module]) -> None:
        mlp = self.mlp(layer)
        mlp.drop1 = MlpActivationEdits(edits, mlp.drop1)

    def plain_extra_tokens(self, n_extra: int) -> None:
        m = self.module
        if getattr(m, "dynamic_img_size", False) and m.pos_embed is not None and not m.no_embed_class:
            raise InterpError("test-time registers in a plain model with dynamic_img_size=True and a position "
                             "embedding that covers the prefix tokens are not supported (timm resamples it with "
                             "num_prefix_tokens); build the model without dynamic_img_size, or use the hooked model")
        m.patch_drop = InsertExtraTokens(m.patch_drop, m.num_prefix_tokens, n_extra)
        m.num_prefix_tokens = m.num_prefix_tokens + n_extra

    def plain_extra_kv(self, layer: int, kv: KeyValue) -> None:
        block = self.block(layer)
        block.attn = AttentionWithExtraKV(block.attn, *kv)

    def plain_pool(self, pool: nn.Module) -> None:
        if getattr(self.module, "attn_pool", None) is not None:
            raise InterpError("SelectiveCLS on a model with attention pooling (attn_pool) would drop the pooling "
                             "weights from the state dict; use the hooked model instead")
        self.module.attn_pool = pool

    def pool_skip(self, n_extra: int) -> int:
        m = self.module
        return int(m.num_prefix_tokens) + n_extra if getattr(m, "pool_include_prefix", False) else 0


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
