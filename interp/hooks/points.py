"""Hook points inside one timm block, and the hooked forward of its attention and MLP.

The hooked forward reproduces timm's ``Block``/``Attention``/``Mlp`` arithmetic op for op, so with no
hook attached the outputs are bit-identical to timm's. Attention scores and patterns are computed only
when a hook asks for them; otherwise timm's fused kernel (``scaled_dot_product_attention``) is used.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

BLOCK_HOOKS = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")
ATTN_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")
MLP_HOOKS = ("hook_pre", "hook_post")

# Order in which the hooks of block i fire; names relative to ``blocks.{i}``.
BLOCK_HOOK_ORDER = (
    "hook_resid_pre",
    "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
    "hook_attn_out", "hook_resid_mid",
    "mlp.hook_pre", "mlp.hook_post",
    "hook_mlp_out", "hook_resid_post",
)


def install(block: nn.Module) -> None:
    """Add identity ``HookPoint`` children to a timm Block, its attention and its MLP (idempotent).

    HookPoints hold no parameters, so the block's ``state_dict`` keys do not change.
    """
    for parent, names in ((block, BLOCK_HOOKS), (block.attn, ATTN_HOOKS), (block.mlp, MLP_HOOKS)):
        for name in names:
            if not isinstance(getattr(parent, name, None), HookPoint):
                parent.add_module(name, HookPoint())


def is_hooked(hook_point: HookPoint) -> bool:
    """True when any forward hook is attached (a cache, an edit or an nnsight-style observer)."""
    return bool(hook_point._forward_hooks)


def attention_forward(
    attn: nn.Module,
    x: torch.Tensor,
    extra_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    force_pattern: bool = False,
    hooked: bool = True,
) -> torch.Tensor:
    """Hooked forward of ``timm.layers.Attention``: timm's arithmetic op for op, with hook points.

    The one copy of that arithmetic in the package: the plain-module attention bias of patch files
    (``interventions.modules.AttentionWithExtraKV``) runs it with ``hooked=False``.

    Args:
        x: [b, t, d] normed residual stream.
        extra_kv: optional (k', v'), each [h, m, dh], appended as m extra key/value columns
            (not tokens: the output keeps t rows). Used by the attention-bias intervention.
        force_pattern: compute scores/pattern even with no hook on them.
        hooked: False for a plain timm ``Attention`` without hook points (none is called).

    Returns:
        [b, t, d] attention output (after ``proj``, before LayerScale).
    """
    B, N, _ = x.shape
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each [b, h, t, dh]
    q, k = attn.q_norm(q), attn.k_norm(k)
    if hooked:
        q = attn.hook_q(q.transpose(1, 2)).transpose(1, 2)  # hook sees [b, t, h, dh]
        k = attn.hook_k(k.transpose(1, 2)).transpose(1, 2)
        v = attn.hook_v(v.transpose(1, 2)).transpose(1, 2)
    if extra_kv is not None:
        k_extra, v_extra = extra_kv
        k = torch.cat([k, k_extra.to(k.dtype).unsqueeze(0).expand(B, -1, -1, -1)], dim=2)
        v = torch.cat([v, v_extra.to(v.dtype).unsqueeze(0).expand(B, -1, -1, -1)], dim=2)

    if force_pattern or (hooked and (is_hooked(attn.hook_attn_scores) or is_hooked(attn.hook_pattern))):
        q = q * attn.scale
        scores = q @ k.transpose(-2, -1)  # [b, h, t, t(+m)]
        pattern = (attn.hook_pattern(attn.hook_attn_scores(scores).softmax(dim=-1)) if hooked
                   else scores.softmax(dim=-1))
        z = attn.attn_drop(pattern) @ v
    else:
        z = F.scaled_dot_product_attention(
            q, k, v, dropout_p=attn.attn_drop.p if attn.training else 0.0
        )
    z = z.transpose(1, 2)  # [b, t, h, dh]
    if hooked:
        z = attn.hook_z(z)
    out = z.reshape(B, N, attn.attn_dim)
    out = attn.norm(out)
    out = attn.proj(out)
    return attn.proj_drop(out)


def mlp_forward(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Hooked forward of timm ``Mlp``, ``GluMlp`` (incl. SwiGLUPacked) and ``SwiGLU``.

    ``hook_pre`` is the fc1 output ([b, t, d_mlp], or [b, t, 2*d_mlp] for gated MLPs with the
    activated half first for SwiGLU); ``hook_post`` is the input of drop1/fc2 after the
    non-linearity (and gating) [b, t, d_mlp].
    """
    from timm.layers import GluMlp, SwiGLU

    if isinstance(mlp, SwiGLU):
        x_gate, x_lin = mlp.fc1_g(x), mlp.fc1_x(x)
        if is_hooked(mlp.hook_pre):
            x_gate, x_lin = mlp.hook_pre(torch.cat([x_gate, x_lin], dim=-1)).chunk(2, dim=-1)
        h = mlp.act(x_gate) * x_lin
    elif isinstance(mlp, GluMlp):
        h = mlp.hook_pre(mlp.fc1(x))
        x1, x2 = h.chunk(2, dim=mlp.chunk_dim)
        h = x1 * mlp.act(x2) if mlp.gate_last else mlp.act(x1) * x2
    else:
        h = mlp.act(mlp.hook_pre(mlp.fc1(x)))
    h = mlp.hook_post(h)
    h = mlp.drop1(h)
    h = mlp.norm(h)
    h = mlp.fc2(h)
    return mlp.drop2(h)


def block_forward(
    block: nn.Module,
    x: torch.Tensor,
    extra_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    force_pattern: bool = False,
) -> torch.Tensor:
    """Hooked forward of ``timm.models.vision_transformer.Block``. x: [b, t, d] -> [b, t, d]."""
    resid_pre = block.hook_resid_pre(x)
    attn_out = block.hook_attn_out(
        block.ls1(attention_forward(block.attn, block.norm1(resid_pre), extra_kv, force_pattern))
    )
    resid_mid = block.hook_resid_mid(resid_pre + block.drop_path1(attn_out))
    mlp_out = block.hook_mlp_out(block.ls2(mlp_forward(block.mlp, block.norm2(resid_mid))))
    return block.hook_resid_post(resid_mid + block.drop_path2(mlp_out))
