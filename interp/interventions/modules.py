"""``nn.Module`` forms of the edits: run by the hooks of a ``HookedViT`` and swapped into plain timm models.

MLP edits (:class:`AblationEdit`, :class:`RelocationEdit`, :class:`RegisterNeuronEdit`) map the MLP
activation [b, t, d_mlp] to its edited value by calling the functions of :mod:`.edits`.

Plain-model swaps (used by ``interp.patch.apply``; none adds a ``state_dict`` key, all tensors are
non-persistent buffers that follow ``.to(device)``):

* :class:`MlpActivationEdits` replaces ``blocks[l].mlp.drop1``, which timm's ``Mlp``/``GluMlp``/``SwiGLU``
  call right after the non-linearity (and gating);
* :class:`InsertExtraTokens` replaces ``patch_drop`` (called after the position embedding);
* :class:`AttentionWithExtraKV` replaces ``blocks[l].attn``, adopting its ``qkv``/``proj``/norm children.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..hooks.points import attention_forward
from . import edits


class NeuronEdit(nn.Module):
    """Base of the MLP edits: holds the neuron indices [k] and the token layout; subclasses define ``edit``."""

    def __init__(self, neurons: Sequence[int], n_prefix: int):
        super().__init__()
        self.register_buffer("idx", torch.as_tensor(list(neurons), dtype=torch.long), persistent=False)
        self.n_prefix = int(n_prefix)

    def edit(self, sel: torch.Tensor) -> torch.Tensor:  # [b, t, k] -> [b, t, k]
        raise NotImplementedError

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [b, t, d_mlp] -> edited h [b, t, d_mlp]."""
        return edits.edit_columns(h, self.idx, self.edit)


class AblationEdit(NeuronEdit):
    def __init__(self, neurons, n_prefix: int, mode: str, tokens: str, means: Optional[torch.Tensor] = None):
        super().__init__(neurons, n_prefix)
        self.mode, self.tokens = mode, tokens
        self.register_buffer("means", None if means is None else means.detach().clone().float(), persistent=False)

    def edit(self, sel):
        return edits.ablate(sel, self.n_prefix, self.mode, self.tokens, self.means)

    def extra_repr(self) -> str:
        return f"neurons={self.idx.tolist()}, mode={self.mode}, tokens={self.tokens}"


class RelocationEdit(NeuronEdit):
    def __init__(self, neurons, n_prefix: int, target: torch.Tensor, value: str):
        super().__init__(neurons, n_prefix)
        self.value = value
        self.register_buffer("target", target.detach().reshape(-1).clone().bool(), persistent=False)

    def edit(self, sel):
        return edits.relocate(sel, self.n_prefix, self.target, self.value)

    def extra_repr(self) -> str:
        return f"neurons={self.idx.tolist()}, value={self.value}, target_cells={int(self.target.sum())}"


class RegisterNeuronEdit(NeuronEdit):
    def __init__(self, neurons, n_prefix: int, extra_start: Optional[int], n_extra: int, value: str,
                 patch_fill: str):
        super().__init__(neurons, n_prefix)
        self.extra_start, self.n_extra, self.value, self.patch_fill = extra_start, int(n_extra), value, patch_fill

    def edit(self, sel):
        return edits.move_to_register(sel, self.n_prefix, self.extra_start, self.n_extra, self.value,
                                      self.patch_fill)

    def extra_repr(self) -> str:
        return (f"neurons={self.idx.tolist()}, registers=[{self.extra_start}, +{self.n_extra}), "
                f"value={self.value}, patch_fill={self.patch_fill}")


class MlpActivationEdits(nn.Module):
    """Stand-in for ``mlp.drop1``: applies ``edits`` in order, then the original dropout."""

    def __init__(self, edit_modules: Sequence[nn.Module], drop: nn.Module):
        super().__init__()
        self.edits = nn.ModuleList(edit_modules)
        self.drop = drop

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for edit in self.edits:
            h = edit(h)
        return self.drop(h)


class InsertExtraTokens(nn.Module):
    """Stand-in for ``patch_drop``: the original module, then ``n_extra`` zero tokens after ``n_prefix`` rows.

    x [b, t, d] -> [b, t + n_extra, d]; the tokens get no position embedding (it was added before).
    """

    def __init__(self, patch_drop: nn.Module, n_prefix: int, n_extra: int):
        super().__init__()
        self.patch_drop = patch_drop
        self.n_prefix, self.n_extra = int(n_prefix), int(n_extra)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_drop(x)
        zeros = x.new_zeros(x.shape[0], self.n_extra, x.shape[-1])
        return torch.cat([x[:, :self.n_prefix], zeros, x[:, self.n_prefix:]], dim=1)

    def extra_repr(self) -> str:
        return f"n_prefix={self.n_prefix}, n_extra={self.n_extra}"


def attention_with_extra_kv(attn: nn.Module, x: torch.Tensor, k_extra: torch.Tensor,
                            v_extra: torch.Tensor) -> torch.Tensor:
    """timm ``Attention`` with m extra key/value columns, on a plain module: the hooked arithmetic
    (:func:`interp.hooks.points.attention_forward`) without hook points. x [b, t, d], k_extra/v_extra
    [h, m, dh] -> [b, t, d]."""
    return attention_forward(attn, x, (k_extra, v_extra), hooked=False)


class AttentionWithExtraKV(nn.Module):
    """Stand-in for a timm ``Attention`` that appends (k', v') [h, m, dh] as extra key/value columns.

    It adopts the original's children under the same names, so the block's ``state_dict`` keys are unchanged.
    """

    def __init__(self, attn: nn.Module, k_extra: torch.Tensor, v_extra: torch.Tensor):
        super().__init__()
        for name in ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop"):
            self.add_module(name, getattr(attn, name))
        self.num_heads, self.head_dim, self.attn_dim = attn.num_heads, attn.head_dim, attn.attn_dim
        self.register_buffer("k_extra", k_extra.detach().clone(), persistent=False)
        self.register_buffer("v_extra", v_extra.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("AttentionWithExtraKV does not take attention masks")
        return attention_with_extra_kv(self, x, self.k_extra, self.v_extra)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, extra_columns={self.k_extra.shape[1]}"
