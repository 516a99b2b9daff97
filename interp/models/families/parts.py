"""Hooked pieces several families share: hook-point installation, attention from q/k/v, timm's MLPs.

Each reproduces timm's arithmetic op for op, so with no hook attached the outputs equal timm's. Attention
scores and patterns are computed only when a hook asks for them (or ``force_pattern``); otherwise timm's fused
kernel (``scaled_dot_product_attention``) runs, as timm's own modules do.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from ...errors import InterpError

KeyValue = Tuple[torch.Tensor, torch.Tensor]  # (k', v'), each [h, m, dh]

BLOCK_HOOKS = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")
ATTN_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")
MLP_HOOKS = ("hook_pre", "hook_post")

# Order in which the hooks of one block fire; names relative to the block's prefix (``blocks.{i}``).
BLOCK_HOOK_ORDER = (
    "hook_resid_pre",
    "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
    "hook_attn_out", "hook_resid_mid",
    "mlp.hook_pre", "mlp.hook_post",
    "hook_mlp_out", "hook_resid_post",
)


def install(block: nn.Module, extra_attn: Sequence[str] = (), extra_mlp: Sequence[str] = ()) -> None:
    """Add identity ``HookPoint`` children to a block, its ``attn`` and its ``mlp`` (idempotent).

    HookPoints hold no parameters, so the block's ``state_dict`` keys do not change.
    """
    groups = ((block, BLOCK_HOOKS), (block.attn, ATTN_HOOKS + tuple(extra_attn)),
              (block.mlp, MLP_HOOKS + tuple(extra_mlp)))
    for parent, names in groups:
        for name in names:
            if not isinstance(getattr(parent, name, None), HookPoint):
                parent.add_module(name, HookPoint())


def is_hooked(hook_point: HookPoint) -> bool:
    """True when any forward hook is attached (a cache, an edit or an nnsight-style observer)."""
    return bool(hook_point._forward_hooks)


def hook_heads(hook: Optional[HookPoint], t: torch.Tensor) -> torch.Tensor:
    """``t`` [b, h, t, dh] through ``hook``, which sees it as [b, t, h, dh] (TransformerLens' order)."""
    return t if hook is None else hook(t.transpose(1, 2)).transpose(1, 2)


def attend(attn: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           extra_kv: Optional[KeyValue] = None, force_pattern: bool = False, hooked: bool = True,
           mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Softmax attention of q/k/v [b, h, t, dh] (keys may be fewer than queries) -> z [b, t, h, dh] after
    ``attn.hook_z``: the arithmetic of timm's ``Attention``/``EvaAttention``/PVT ``Attention``.

    Args:
        attn: the attention module (its ``scale``, ``attn_drop`` and, when ``hooked``, hook points).
        extra_kv: (k', v'), each [h, m, dh], appended as m extra key/value columns (the attention-bias edit).
        force_pattern: compute scores/pattern even with no hook on them.
        hooked: False for a plain timm module without hook points.
        mask: an additive attention mask broadcastable to [b, h, t, t_k], as timm passes it.
    """
    B = q.shape[0]
    if extra_kv is not None:
        k_extra, v_extra = extra_kv
        k = torch.cat([k, k_extra.to(k.dtype).unsqueeze(0).expand(B, -1, -1, -1)], dim=2)
        v = torch.cat([v, v_extra.to(v.dtype).unsqueeze(0).expand(B, -1, -1, -1)], dim=2)
    if force_pattern or (hooked and (is_hooked(attn.hook_attn_scores) or is_hooked(attn.hook_pattern))):
        scores = (q * attn.scale) @ k.transpose(-2, -1)  # [b, h, t, t_k(+m)]
        if mask is not None:
            scores = scores + mask
        pattern = (attn.hook_pattern(attn.hook_attn_scores(scores).softmax(dim=-1)) if hooked
                   else scores.softmax(dim=-1))
        z = attn.attn_drop(pattern) @ v
    else:
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=attn.attn_drop.p if attn.training else 0.0)
    z = z.transpose(1, 2)  # [b, t, h, dh]
    return attn.hook_z(z) if hooked else z


def head_writes(attn: nn.Module, gain: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(Tensor[h, dh, d], bias [d]): each head's slice of ``attn.proj``'s columns times the branch's LayerScale
    ``gain`` [d] (None: none), and the bias it adds once; refused when something sits between ``hook_z`` and
    ``proj`` (a norm over the heads, a gate), as then the heads do not add up linearly."""
    if not isinstance(getattr(attn, "norm", None), (nn.Identity, type(None))) or getattr(attn, "gate", None) is not None:
        raise InterpError("this attention normalises or gates the heads' concatenated output before its proj: "
                          "the heads' writes do not add up linearly, so there is no per-head decomposition")
    w = attn.proj.weight.detach().float()  # [d, h * dh]
    d = w.shape[0]
    per_head = w.reshape(d, attn.num_heads, -1).permute(1, 2, 0)  # [h, dh, d]
    bias = attn.proj.bias.detach().float() if attn.proj.bias is not None else torch.zeros(d, device=w.device)
    if gain is not None:
        per_head, bias = per_head * gain.detach().float(), bias * gain.detach().float()
    return per_head, bias


class QkvRows(NamedTuple):
    """An attention's input projections as views of its parameters (writing into them writes the model): weights
    [h * dh, d_in] (row ``i * dh + j``: dim j of head i; d_in the width the projection reads), biases [h * dh],
    None where there is none or it is a fixed zero buffer (the k bias of EVA and Swin-v2)."""

    q_weight: torch.Tensor
    q_bias: Optional[torch.Tensor]
    k_weight: torch.Tensor
    k_bias: Optional[torch.Tensor]
    v_weight: torch.Tensor
    v_bias: Optional[torch.Tensor]


def fused_qkv_rows(attn: nn.Module) -> QkvRows:
    """:class:`QkvRows` of an attention with timm's fused ``qkv`` linear [3 * h * dh, d] (q, k, v rows in that
    order): its own bias, or the separate ``q_bias``/``v_bias`` parameters of EVA and Swin-v2 (k bias zero)."""
    w, d = attn.qkv.weight, attn.qkv.out_features // 3
    q_bias = getattr(attn, "q_bias", None)
    if q_bias is not None:
        return QkvRows(w[:d], q_bias, w[d:2 * d], None, w[2 * d:], attn.v_bias)
    b = attn.qkv.bias
    if b is None:
        return QkvRows(w[:d], None, w[d:2 * d], None, w[2 * d:], None)
    return QkvRows(w[:d], b[:d], w[d:2 * d], b[d:2 * d], w[2 * d:], b[2 * d:])


def mlp_forward(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Hooked forward of timm ``Mlp``, ``GluMlp`` (incl. SwiGLUPacked) and ``SwiGLU``.

    ``hook_pre`` is the fc1 output ([b, t, d_mlp], or [b, t, 2*d_mlp] for gated MLPs, the activated half first
    for SwiGLU); ``hook_post`` is the input of drop1/fc2 after the non-linearity (and gating) [b, t, d_mlp]:
    the neurons. A gated MLP's gate alone (after its non-linearity) fires ``hook_gate`` [b, t, d_mlp] when the
    MLP has that hook point.
    """
    from timm.layers import GluMlp, SwiGLU

    gate_hook = getattr(mlp, "hook_gate", None)
    if isinstance(mlp, SwiGLU):
        x_gate, x_lin = mlp.fc1_g(x), mlp.fc1_x(x)
        if is_hooked(mlp.hook_pre):
            x_gate, x_lin = mlp.hook_pre(torch.cat([x_gate, x_lin], dim=-1)).chunk(2, dim=-1)
        gate = mlp.act(x_gate)
        h = (gate if gate_hook is None else gate_hook(gate)) * x_lin
    elif isinstance(mlp, GluMlp):
        h = mlp.hook_pre(mlp.fc1(x))
        x1, x2 = h.chunk(2, dim=mlp.chunk_dim)
        gate = mlp.act(x2) if mlp.gate_last else mlp.act(x1)
        gate = gate if gate_hook is None else gate_hook(gate)
        h = x1 * gate if mlp.gate_last else gate * x2
    else:
        h = mlp.act(mlp.hook_pre(mlp.fc1(x)))
    h = mlp.hook_post(h)
    h = mlp.drop1(h)
    h = mlp.norm(h)
    h = mlp.fc2(h)
    return mlp.drop2(h)


def is_gated(mlp: nn.Module) -> bool:
    """True for timm's gated MLPs (``GluMlp``, ``SwiGLU``), whose neurons are gate x linear products."""
    from timm.layers import GluMlp, SwiGLU

    return isinstance(mlp, (GluMlp, SwiGLU))


class MlpActivationEdits(nn.Module):
    """Stand-in for a plain model's ``mlp.drop1`` (the module timm's MLPs call right after the non-linearity and
    gating): applies ``edits`` in order, then the original dropout."""

    def __init__(self, edit_modules: Sequence[nn.Module], drop: nn.Module):
        super().__init__()
        self.edits = nn.ModuleList(edit_modules)
        self.drop = drop

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for edit in self.edits:
            h = edit(h)
        return self.drop(h)


class InsertExtraTokens(nn.Module):
    """Stand-in for the module a plain model runs right after adding position embeddings (ViT's ``patch_drop``,
    Eva's ``pos_drop``): that module, then ``n_extra`` zero tokens after ``n_prefix`` rows (test-time registers).
    x [b, t, d] -> [b, t + n_extra, d]; the tokens get no position embedding (it was added before)."""

    def __init__(self, inner: nn.Module, n_prefix: int, n_extra: int):
        super().__init__()
        self.inner = inner
        self.n_prefix, self.n_extra = int(n_prefix), int(n_extra)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inner(x)
        zeros = x.new_zeros(x.shape[0], self.n_extra, x.shape[-1])
        return torch.cat([x[:, :self.n_prefix], zeros, x[:, self.n_prefix:]], dim=1)

    def extra_repr(self) -> str:
        return f"n_prefix={self.n_prefix}, n_extra={self.n_extra}"


def unsupported_mlp(mlp: nn.Module) -> Optional[str]:
    """Why the hooked forward cannot run ``mlp`` (timm's ``Mlp``, ``GluMlp``/SwiGLUPacked or ``SwiGLU`` with linear
    layers only), or None."""
    from timm.layers import GluMlp, Mlp, SwiGLU

    if type(mlp) not in (Mlp, GluMlp, SwiGLU):
        return f"MLP type {type(mlp).__name__} (Mlp, GluMlp/SwiGLUPacked or SwiGLU)"
    if isinstance(mlp, (Mlp, GluMlp)) and isinstance(mlp.fc1, nn.Conv2d):
        return "convolutional MLP"
    return None


def grid_tokens(feature_map: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """A pyramid's [b, h, w, d] map (its patch embedding's or a downsampling's output) -> (tokens [b, h*w, d]
    row-major, the grid (h, w))."""
    b, h, w, d = feature_map.shape
    return feature_map.reshape(b, h * w, d), (h, w)


def check_blocks(family, block_types: Tuple[type, ...], attn_types: Tuple[type, ...],
                 problem: Callable[[nn.Module], Optional[str]] = lambda block: None) -> None:
    """Refuse (``family.unsupported``) the first of ``family.blocks()`` whose class is not one of ``block_types``,
    whose attention's is not one of ``attn_types``, or of which ``problem`` names what else the hooked forward
    cannot run (a one-line phrase, or None)."""
    def names(types):
        return " or ".join(f"{t.__module__}.{t.__qualname__}" for t in types)

    for prefix, block in family.blocks():
        found = (f"block type {type(block).__name__} (only {names(block_types)})" if type(block) not in block_types
                 else f"attention type {type(block.attn).__name__} (only {names(attn_types)})"
                 if type(block.attn) not in attn_types else problem(block))
        if found:
            raise family.unsupported(f"{prefix} has an unsupported {found}")
