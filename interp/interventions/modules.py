"""``nn.Module`` forms of the MLP edits: run by the hooks of a ``HookedViT`` and swapped into plain timm models.

MLP edits (:class:`AblationEdit`, :class:`RelocationEdit`, :class:`RegisterNeuronEdit`) map the MLP
activation [b, t, d_mlp] to its edited value by calling the functions of :mod:`.edits`. Where a plain timm
model takes them (and test-time tokens, extra key/values, a pooling) is its family adapter's business
(``Family.plain_*``, :mod:`interp.models.families`); none adds a ``state_dict`` key, all tensors are
non-persistent buffers that follow ``.to(device)``.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import nn

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
    def __init__(self, neurons, n_prefix: int, mode: str, tokens: str, means: Optional[torch.Tensor] = None,
                 donors: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        super().__init__(neurons, n_prefix)
        self.mode, self.tokens, self.donors = mode, tokens, donors
        self.register_buffer("means", None if means is None else means.detach().clone().float(), persistent=False)

    def edit(self, sel):
        donors = self.donors(sel) if self.mode == "resample" else None
        return edits.ablate(sel, self.n_prefix, self.mode, self.tokens, self.means, donors)

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
