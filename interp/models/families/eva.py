"""The Eva family: timm's ``Eva`` (``timm/models/eva.py``): DINOv3 (``vit_*_patch16_dinov3*``, 4 storage tokens),
Perception Encoder (``vit_pe_core_*``, attention pooling), EVA02 (``eva02_*``, SwiGLU), EVA (``eva_*``) and
ROPE-ViT (``vit_*_rope_*``), built from ``EvaBlock`` with ``EvaAttention`` or ``timm.layers.AttentionRope``.

Blocks are ``blocks.{i}``; tokens are ``[CLS?, registers..., patches...]`` (``num_prefix_tokens``; DINOv3's
storage tokens are timm's ``reg_token``, so they are the layout's registers). What differs from a ViT:

* rotary position embedding (RoPE) on q and k of the patch tokens only (the prefix tokens are skipped), one
  table per forward from ``Eva._pos_embed`` (per block for ``rope_type='mixed'``). ``attn.hook_q``/``hook_k``
  are q and k *before* RoPE (after ``q_norm``/``k_norm``); ``attn.hook_rot_q``/``hook_rot_k`` are them after
  RoPE, what the scores are computed from (TransformerLens' names for rotary models). A model without RoPE
  has no ``hook_rot_*``;
* LayerScale is ``gamma_1``/``gamma_2`` (parameters of the block, None when the model has none); both hook
  ``hook_attn_out``/``hook_mlp_out`` see the branch after it, as the residual stream receives it;
* the attention may normalise its output (``scale_norm``) and gate it (``gated_attn``), the MLP may be
  ``GluMlp``/``SwiGLU`` with an inner norm (``scale_mlp``), pooling may be ``AttentionPoolLatent`` over all
  tokens (PE).

Post-norm blocks (``EvaBlockPostNorm``, ``use_post_norm=True``: EVA02-E CLIP) normalise each branch's output
instead of its input and have no LayerScale; there, as through the inner MLP norm of ``scale_mlp`` (EVA02), a
neuron's write is not linear in its activation, and ``neuron_writes`` linearises it at the data's operating point
(``Family.write_norms``, ``norm_writes.py``). With grouped-query attention
(``num_kv_heads``: Sapiens2 above 0.1B) ``hook_k``/``hook_v``/``hook_rot_k`` have the key/value heads
[b, t, h_kv, dh]; scores and patterns have every query head (query head i reads key/value head i // groups).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import InterpError
from .parts import KeyValue, QkvRows, attend, fused_qkv_rows, head_writes, hook_heads, mlp_forward
from .plain_stack import PlainStackFamily

ROPE_HOOKS = ("hook_rot_q", "hook_rot_k")


class EvaFamily(PlainStackFamily):
    name = "eva"
    title = ("timm Eva: DINOv3 (vit_*_patch16_dinov3*), Perception Encoder (vit_pe_core_*), EVA02 (eva02_*), "
             "EVA (eva_*), ROPE-ViT (vit_*_rope_*), LingBot-Vision (vit_*_lingbot), Sapiens2 (vit_*_sapiens2)")
    timm_modules = ("timm.models.eva",)
    after_position = "pos_drop"

    @classmethod
    def timm_class(cls) -> type:
        from timm.models.eva import Eva

        return Eva

    def block_types(self) -> Tuple[Tuple[type, ...], Tuple[type, ...]]:
        from timm.layers import AttentionRope
        from timm.models.eva import EvaAttention, EvaBlock, EvaBlockPostNorm

        return (EvaBlock, EvaBlockPostNorm), (EvaAttention, AttentionRope)

    # ------------------------------------------------------------------ anatomy
    @property
    def has_rope(self) -> bool:
        return getattr(self.module, "rope", None) is not None

    def attn_gain(self, layer: int) -> Optional[torch.Tensor]:
        return getattr(self.block(layer), "gamma_1", None)

    def mlp_gain(self, layer: int) -> Optional[torch.Tensor]:
        return getattr(self.block(layer), "gamma_2", None)

    def attn_in_proj(self, layer: int) -> QkvRows:
        """The fused ``qkv`` (EVA's separate q/v biases, fixed zero k bias), or ``q_proj``/``k_proj``/``v_proj``
        (``AttentionRope`` without fused projections; k and v have ``num_kv_heads`` heads)."""
        attn = self.block(layer).attn
        if attn.qkv is not None:
            return fused_qkv_rows(attn)
        q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
        return QkvRows(q.weight, q.bias, k.weight, k.bias, v.weight, v.bias)

    def write_norms(self, layer: int):
        """The inner MLP norm (``scale_mlp``) before ``fc2``; a post-norm block's ``norm2`` after it."""
        from timm.models.eva import EvaBlockPostNorm

        block = self.block(layer)
        return super().write_norms(layer)[0], block.norm2 if isinstance(block, EvaBlockPostNorm) else None

    def head_writes(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if not hasattr(self.block(layer), "gamma_1"):
            raise InterpError("a post-norm Eva block normalises its attention branch after proj: the heads' writes "
                              "do not add up linearly, so there is no per-head decomposition")
        return head_writes(self.block(layer).attn, self.attn_gain(layer))

    def check_input(self, x: torch.Tensor, model_name: str) -> None:
        """``(H, W)`` must be the model's own size, or any multiple of the patch size for models built with
        ``dynamic_img_size=True`` (DINOv3's default; any size with ``dynamic_img_pad``)."""
        super().check_input(x, model_name)
        self.check_patch_grid_size(x, model_name, getattr(self.module, "dynamic_img_size", False),
                                   "compute its position embeddings for the input's size")

    # ------------------------------------------------------------------ hook points
    def extra_attn_hooks(self) -> Tuple[str, ...]:
        """q and k after RoPE (``hook_rot_q``, ``hook_rot_k``) where the model rotates them."""
        return ROPE_HOOKS if self.has_rope else ()

    # ------------------------------------------------------------------ hooked forward
    def position(self, patches: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """timm's ``Eva._pos_embed``: prefix tokens, position embedding, ``pos_drop``, and the RoPE table for the
        input's grid."""
        return self.module._pos_embed(patches)

    def residual_stream(self, hooked, x: torch.Tensor, n_blocks: Optional[int] = None) -> torch.Tensor:
        m = self.module
        blocks = m.blocks if n_blocks is None else m.blocks[:n_blocks]
        h, rope = self.embed(hooked, x)
        state, force = hooked.edit_state, hooked.force_patterns
        per_block = getattr(m, "rope_mixed", False) and rope is not None
        for i, block in enumerate(blocks):
            h = block_forward(block, h, rope[i] if per_block else rope, state.n_extra_tokens,
                              state.extra_kv.get(i), force)
        return h

    @property
    def attn_pool_reads_prefix(self) -> bool:
        """``Eva.pool`` hands an attention pool every token, prefix tokens included."""
        return True

    # ------------------------------------------------------------------ plain timm models
    def plain_extra_tokens(self, n_extra: int) -> None:
        """As :meth:`PlainStackFamily.plain_extra_tokens` (after ``pos_drop``); every attention then skips them in
        RoPE as it skips the prefix tokens."""
        super().plain_extra_tokens(n_extra)
        for block in self.module.blocks:
            block.attn.num_prefix_tokens = block.attn.num_prefix_tokens + n_extra

    def plain_extra_kv(self, layer: int, kv: KeyValue) -> None:
        block = self.block(layer)
        block.attn = EvaAttentionWithExtraKV(block.attn, *kv)

    def describe(self):
        m = self.module
        return {"family": self.name, "rope": type(m.rope).__name__ if self.has_rope else None,
                "layerscale": getattr(self.block(0), "gamma_1", None) is not None}


def project_qkv(attn: nn.Module, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [b, h, t, dh] of ``EvaAttention``/``AttentionRope`` from x [b, t, d], as timm computes them (fused
    ``qkv`` with EVA's separate q/v biases and fixed zero k bias, or separate ``q_proj``/``k_proj``/``v_proj``)."""
    B, N, _ = x.shape
    if attn.qkv is not None:
        q_bias = getattr(attn, "q_bias", None)
        if q_bias is None:
            qkv = attn.qkv(x)
        else:
            qkv_bias = torch.cat((q_bias, attn.k_bias, attn.v_bias))
            if attn.qkv_bias_separate:
                qkv = attn.qkv(x)
                qkv += qkv_bias
            else:
                qkv = F.linear(x, weight=attn.qkv.weight, bias=qkv_bias)
        q, k, v = qkv.reshape(B, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v
    n_kv = getattr(attn, "num_kv_heads", attn.num_heads)  # fewer with grouped-query attention
    q = attn.q_proj(x).reshape(B, N, attn.num_heads, -1).transpose(1, 2)
    k = attn.k_proj(x).reshape(B, N, n_kv, -1).transpose(1, 2)
    v = attn.v_proj(x).reshape(B, N, n_kv, -1).transpose(1, 2)
    return q, k, v


def apply_rope(t: torch.Tensor, rope: torch.Tensor, n_skip: int, half: bool, like: torch.Tensor) -> torch.Tensor:
    """RoPE on the rows after the first ``n_skip`` of t [b, h, t, dh], as timm's ``EvaAttention`` does."""
    from timm.layers import apply_rot_embed_cat

    return torch.cat([t[:, :, :n_skip, :], apply_rot_embed_cat(t[:, :, n_skip:, :], rope, half=half)],
                     dim=2).type_as(like)


def attention_forward(attn: nn.Module, x: torch.Tensor, rope: Optional[torch.Tensor], n_extra: int = 0,
                      extra_kv: Optional[KeyValue] = None, force_pattern: bool = False,
                      hooked: bool = True) -> torch.Tensor:
    """Hooked forward of timm's ``EvaAttention`` and ``AttentionRope``: timm's arithmetic op for op, with hook
    points.

    Args:
        x: [b, t, d] normed residual stream.
        rope: the RoPE table of the patch tokens (from ``Eva._pos_embed``), or None.
        n_extra: test-time registers after the prefix tokens; RoPE skips them as it skips the prefix tokens.
        extra_kv: optional (k', v'), each [h, m, dh], appended as m extra key/value columns (no RoPE).
        force_pattern: compute scores/pattern even with no hook on them.
        hooked: False for a plain timm attention without hook points (patch files run it so).

    Returns:
        [b, t, d] attention output (after ``proj``, before LayerScale).
    """
    B, N, _ = x.shape
    gate = attn.gate(x).sigmoid() if attn.gate is not None else None
    q, k, v = project_qkv(attn, x)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if hooked:
        q, k, v = hook_heads(attn.hook_q, q), hook_heads(attn.hook_k, k), hook_heads(attn.hook_v, v)
    if rope is not None:
        n_skip, half = attn.num_prefix_tokens + n_extra, getattr(attn, "rotate_half", False)
        q, k = apply_rope(q, rope, n_skip, half, v), apply_rope(k, rope, n_skip, half, v)
        if hooked:
            q, k = hook_heads(attn.hook_rot_q, q), hook_heads(attn.hook_rot_k, k)
    groups = getattr(attn, "num_kv_groups", 1)
    if groups > 1:  # grouped-query attention: query head i reads key/value head i // groups, as timm expands them
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if extra_kv is not None and extra_kv[0].shape[0] != attn.num_heads:  # columns per key/value head
            extra_kv = tuple(t.repeat_interleave(groups, dim=0) for t in extra_kv)
    z = attend(attn, q, k, v, extra_kv, force_pattern, hooked)
    out = attn.norm(z.reshape(B, N, attn.num_heads * attn.head_dim))
    if gate is not None:
        out = out * gate
    return attn.proj_drop(attn.proj(out))


def block_forward(block: nn.Module, x: torch.Tensor, rope: Optional[torch.Tensor], n_extra: int = 0,
                  extra_kv: Optional[KeyValue] = None, force_pattern: bool = False) -> torch.Tensor:
    """Hooked forward of timm's ``EvaBlock`` (pre-norm, LayerScale ``gamma_1``/``gamma_2`` where it has them) and
    ``EvaBlockPostNorm`` (``norm1``/``norm2`` on each branch's output, no LayerScale: ``hook_attn_out`` and
    ``hook_mlp_out`` are the normed branches the residual stream receives). x: [b, t, d] -> [b, t, d]."""
    post_norm = not hasattr(block, "gamma_1")
    resid_pre = block.hook_resid_pre(x)
    if post_norm:
        attn_out = block.norm1(attention_forward(block.attn, resid_pre, rope, n_extra, extra_kv, force_pattern))
    else:
        attn_out = attention_forward(block.attn, block.norm1(resid_pre), rope, n_extra, extra_kv, force_pattern)
        if block.gamma_1 is not None:
            attn_out = block.gamma_1 * attn_out
    resid_mid = block.hook_resid_mid(resid_pre + block.drop_path1(block.hook_attn_out(attn_out)))
    if post_norm:
        mlp_out = block.norm2(mlp_forward(block.mlp, resid_mid))
    else:
        mlp_out = mlp_forward(block.mlp, block.norm2(resid_mid))
        if block.gamma_2 is not None:
            mlp_out = block.gamma_2 * mlp_out
    return block.hook_resid_post(resid_mid + block.drop_path2(block.hook_mlp_out(mlp_out)))


class EvaAttentionWithExtraKV(nn.Module):
    """Stand-in for a plain timm ``EvaAttention``/``AttentionRope`` that appends (k', v') [h, m, dh] as extra
    key/value columns: the hooked arithmetic (:func:`attention_forward`) without hook points. It adopts the
    original's children and parameters under the same names, so the block's ``state_dict`` keys are unchanged."""

    _CHILDREN = ("qkv", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "attn_drop", "norm", "gate", "proj",
                 "proj_drop")

    def __init__(self, attn: nn.Module, k_extra: torch.Tensor, v_extra: torch.Tensor):
        super().__init__()
        for name in self._CHILDREN:
            child = getattr(attn, name, None)
            if child is not None:
                self.add_module(name, child)
            else:
                setattr(self, name, None)
        for name in ("q_bias", "v_bias"):
            param = getattr(attn, name, None)
            if param is not None:
                self.register_parameter(name, param)
            else:
                setattr(self, name, None)
        k_bias = getattr(attn, "k_bias", None)
        if k_bias is not None:
            self.register_buffer("k_bias", k_bias, persistent=False)
        else:
            self.k_bias = None
        self.num_heads, self.head_dim, self.scale = attn.num_heads, attn.head_dim, attn.scale
        self.num_prefix_tokens = attn.num_prefix_tokens
        self.num_kv_heads = getattr(attn, "num_kv_heads", attn.num_heads)
        self.num_kv_groups = getattr(attn, "num_kv_groups", 1)
        self.qkv_bias_separate = getattr(attn, "qkv_bias_separate", False)
        self.rotate_half = getattr(attn, "rotate_half", False)
        self.register_buffer("k_extra", k_extra.detach().clone(), persistent=False)
        self.register_buffer("v_extra", v_extra.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor, rope: Optional[torch.Tensor] = None, attn_mask=None,
                is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("EvaAttentionWithExtraKV does not take attention masks")
        return attention_forward(self, x, rope, 0, (self.k_extra, self.v_extra), hooked=False)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, extra_columns={self.k_extra.shape[1]}"
