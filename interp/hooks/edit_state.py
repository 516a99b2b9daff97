"""``EditState``: the structural edits the hooked forward honours, in one immutable object.

``HookedViT.edit_state`` holds one; ``HookedViT.intervene`` builds a new one from the interventions it
applies and puts the previous object back on exit. Nothing else writes it, so "no edit active" is simply
``model.edit_state == EditState()``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Mapping, Optional, Tuple

import torch

from ..errors import InterpError

KeyValue = Tuple[torch.Tensor, torch.Tensor]  # (k, v), each [h, m, dh]
# patch tokens [b, n, d] -> (pooled [b, d], per-patch votes [b, n] or None)
PoolFn = Callable[[torch.Tensor], Tuple[torch.Tensor, Optional[torch.Tensor]]]


def merge_extra_kv(existing: Mapping[int, KeyValue], new: Mapping[int, KeyValue],
                   device: torch.device) -> Dict[int, KeyValue]:
    """A new dict with ``new``'s columns appended after ``existing``'s (along the column axis m).

    Args:
        existing, new: {block: (k, v)}, each [h, m, dh] (m may differ between the two).
        device: where ``new``'s tensors are moved.
    """
    merged = dict(existing)
    for layer, (k, v) in new.items():
        k, v = k.to(device), v.to(device)
        if layer in merged:
            k0, v0 = merged[layer]
            k, v = torch.cat([k0, k.to(k0.dtype)], dim=1), torch.cat([v0, v.to(v0.dtype)], dim=1)
        merged[layer] = (k, v)
    return merged


@dataclass(frozen=True)
class EditState:
    """Structural edits of the hooked forward (neuron edits are hooks and live elsewhere).

    Attributes:
        n_extra_tokens: zero tokens (test-time registers) inserted right after the model's prefix tokens,
            before ``norm_pre``; the layout counts them as prefix tokens.
        extra_kv: {block: (k', v')}, each [h, m, dh]: m extra key/value columns appended in that block's
            attention (not tokens: the output keeps t rows).
        pool_override: replaces timm's pooling; patch tokens [b, n, d] -> (pooled [b, d], votes [b, n] or None).
    """

    n_extra_tokens: int = 0
    extra_kv: Mapping[int, KeyValue] = field(default_factory=dict)
    pool_override: Optional[PoolFn] = None

    def add_tokens(self, n: int) -> "EditState":
        """This state with ``n`` more test-time registers (after the ones already there)."""
        if n < 0:
            raise ValueError(f"cannot add {n} tokens")
        return replace(self, n_extra_tokens=self.n_extra_tokens + n)

    def add_kv(self, kv: Mapping[int, KeyValue], device: torch.device) -> "EditState":
        """This state with ``kv``'s key/value columns appended after the existing ones of each block."""
        if not kv:
            return self
        return replace(self, extra_kv=merge_extra_kv(self.extra_kv, kv, device))

    def set_pool(self, pool: PoolFn) -> "EditState":
        """This state with ``pool`` replacing the pooling.

        Raises:
            InterpError: a pooling override is already set (two pooling interventions at once).
        """
        if self.pool_override is not None:
            raise InterpError("a pooling intervention is already active; use one SelectiveCLS at a time")
        return replace(self, pool_override=pool)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "EditState":
        """This state with ``fn`` applied to every extra key/value tensor (device and dtype moves)."""
        if not self.extra_kv:
            return self
        return replace(self, extra_kv={i: (fn(k), fn(v)) for i, (k, v) in self.extra_kv.items()})
