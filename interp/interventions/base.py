"""The ``Intervention`` base class: the declarative pieces every intervention provides, and the hooked path.

An intervention describes its edit once, as up to four pieces:

* ``mlp_edits(ctx) -> {layer: module}``: modules mapping the MLP activation after the non-linearity
  ``h`` [b, t, d_mlp] to its edited value (``blocks.{layer}.mlp.hook_post`` in the hooked model,
  the input of ``blocks[layer].mlp.drop1`` in a plain timm model);
* ``n_extra_tokens``: zero tokens it inserts after the model's prefix tokens;
* ``extra_kv() -> {layer: (k, v)}``: extra key/value columns [heads, m, head_dim] per block;
* ``pool_module() -> module or None``: a replacement of the pooling, patch tokens [b, n, d] -> [b, d].

The hooked path (``setup``/``attach``/``teardown``, called by ``HookedViT.intervene``) and the plain-module
path (``interp.patch.apply``) both build from these pieces, so both run the same modules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from ..errors import InterpError

STRUCTURAL, NEURON, POOLING = 0, 1, 2  # composition stages (see interp.hooks.intervene)

Neurons = Dict[int, List[int]]


def normalize_neurons(neurons: Mapping[Any, Sequence[int]]) -> Neurons:
    """``{layer: [neuron, ...]}`` with int keys (JSON gives strings), sorted layers, no duplicate neurons.

    Raises:
        ValueError: empty selection, a negative index or a repeated neuron.
    """
    if not isinstance(neurons, Mapping) or not neurons:
        raise ValueError("neurons must be a non-empty dict {layer: [neuron index, ...]}, e.g. {5: [12, 40]}")
    out: Neurons = {}
    for layer, idx in neurons.items():
        layer = int(layer)
        idx = [int(i) for i in (idx.tolist() if isinstance(idx, torch.Tensor) else idx)]
        if layer < 0 or not idx or min(idx) < 0:
            raise ValueError(f"neurons[{layer}] = {idx}: layers and neuron indices must be >= 0, lists non-empty")
        if len(set(idx)) != len(idx):
            raise ValueError(f"neurons[{layer}] lists a neuron twice: {idx}")
        out[layer] = idx
    return dict(sorted(out.items()))


def check_neurons(neurons: Neurons, n_layers: int, d_mlp: int) -> None:
    """Raise :class:`InterpError` when a layer or neuron index does not exist in the model."""
    for layer, idx in neurons.items():
        if layer >= n_layers:
            raise InterpError(f"layer {layer} does not exist: the model has blocks 0..{n_layers - 1}")
        if max(idx) >= d_mlp:
            raise InterpError(f"neuron {max(idx)} in layer {layer} does not exist: the MLP has {d_mlp} "
                              f"neurons (0..{d_mlp - 1})")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


@dataclass(frozen=True)
class EditContext:
    """Where things sit on the token axis when an edit runs.

    Attributes:
        base_prefix: the model's own prefix tokens (CLS + trained registers).
        n_prefix: all prefix tokens, test-time registers of every intervention included; patches follow.
        extra_start: row of this intervention's first test-time register (None if it adds none).
        n_layers, d_mlp: model sizes, for validating neuron indices.
    """

    base_prefix: int
    n_prefix: int
    extra_start: Optional[int]
    n_layers: int
    d_mlp: int


def model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


class Intervention:
    """Base class of all interventions (dataclasses). Subclasses set ``kind`` and ``stage``.

    Serialisation: ``params()`` (JSON-able) and ``tensors()`` ({name: Tensor}) round-trip through
    ``from_params(params, tensors)``; ``kind`` names the class in a patch file.
    """

    kind: ClassVar[str] = ""
    stage: ClassVar[int] = NEURON
    registry: ClassVar[Dict[str, type]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.kind:
            Intervention.registry[cls.kind] = cls

    # ------------------------------------------------------------------ declarative pieces
    @property
    def n_extra_tokens(self) -> int:
        return 0

    def mlp_edits(self, ctx: EditContext) -> Dict[int, nn.Module]:
        return {}

    def extra_kv(self) -> Dict[int, Tuple[torch.Tensor, torch.Tensor]]:
        return {}

    def pool_module(self, skip: int = 0) -> Optional[nn.Module]:
        """Replacement pooling: tokens [b, skip + n, d] -> [b, d] (first ``skip`` rows ignored), or None."""
        return None

    # ------------------------------------------------------------------ serialisation
    def params(self) -> Dict[str, Any]:
        raise NotImplementedError

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {}

    @classmethod
    def from_params(cls, params: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "Intervention":
        return cls(**params)

    # ------------------------------------------------------------------ hooked path (InterventionMixin protocol)
    def setup(self, model) -> None:
        """Record where this intervention's test-time registers go; add its structural state."""
        if getattr(self, "_saved", None) is not None:
            raise InterpError(f"this {self.kind} is already applied (nested intervene?); pass a copy instead")
        pool = self.pool_module()
        if pool is not None and model.pool_override is not None:
            raise InterpError("a pooling intervention is already active; use one SelectiveCLS at a time")
        kv = self.extra_kv()
        self._saved = (model.n_extra_tokens, model.extra_kv, model.pool_override)
        self._extra_start = model.layout.n_prefix if self.n_extra_tokens else None
        model.n_extra_tokens += self.n_extra_tokens
        if kv:
            model.extra_kv = merge_extra_kv(model.extra_kv, kv, model_device(model))
        if pool is not None:
            model.pool_override = pool.to(model_device(model)).pool_with_votes

    def attach(self, model) -> List[Tuple[str, Any]]:
        """Forward hooks running this intervention's MLP edits on ``blocks.{layer}.mlp.hook_post``."""
        ctx = EditContext(base_prefix=model.base_layout.n_prefix, n_prefix=model.layout.n_prefix,
                          extra_start=getattr(self, "_extra_start", None), n_layers=model.n_layers,
                          d_mlp=model.d_mlp)
        device = model_device(model)
        hooks = []
        for layer, edit in self.mlp_edits(ctx).items():
            edit = edit.to(device)
            hooks.append((f"blocks.{layer}.mlp.hook_post", lambda h, hook, edit=edit: edit(h)))
        return hooks

    def teardown(self, model) -> None:
        """Restore the structural state ``setup`` found (teardowns run in reverse setup order)."""
        model.n_extra_tokens, model.extra_kv, model.pool_override = self._saved
        self._saved, self._extra_start = None, None


def merge_extra_kv(existing: Dict[int, Tuple[torch.Tensor, torch.Tensor]],
                   new: Dict[int, Tuple[torch.Tensor, torch.Tensor]],
                   device: torch.device) -> Dict[int, Tuple[torch.Tensor, torch.Tensor]]:
    """A new dict with ``new``'s columns appended after ``existing``'s (along the column axis m)."""
    merged = dict(existing)
    for layer, (k, v) in new.items():
        k, v = k.to(device), v.to(device)
        if layer in merged:
            k0, v0 = merged[layer]
            k, v = torch.cat([k0, k.to(k0.dtype)], dim=1), torch.cat([v0, v.to(v0.dtype)], dim=1)
        merged[layer] = (k, v)
    return merged
