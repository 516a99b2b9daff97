"""The ``Intervention`` base class: the declarative pieces every intervention provides, and the hooked path.

An intervention describes its edit once, as up to five pieces:

* ``mlp_edits(ctx) -> {layer: module}``: modules mapping the MLP activation after the non-linearity
  ``h`` [b, t, d_mlp] to its edited value (``blocks.{layer}.mlp.hook_post`` in the hooked model,
  the input of ``blocks[layer].mlp.drop1`` in a plain timm model);
* ``n_extra_tokens``: zero tokens it inserts after the model's prefix tokens;
* ``extra_kv() -> {layer: (k, v)}``: extra key/value columns [heads, m, head_dim] per block;
* ``pool_module() -> module or None``: a replacement of the pooling, patch tokens [b, n, d] -> [b, d];
* ``resid_edits(ctx) -> {layer: module}``: modules mapping block ``layer``'s output [b, t, d] to its edited
  value (``blocks.{layer}.hook_resid_post``; a forward hook on ``blocks[layer]`` in a plain timm model).

The hooked path (``setup``/``attach``/``teardown``, called by ``HookedViT.intervene``) and the plain-module
path (``interp.patch.apply``) both build from these pieces, so both run the same modules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..errors import InterpError
from ..hooks.edit_state import EditState
from .neuron_sets import check_ranked_on, neuron_set

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


def take_neurons(item: Any) -> Neurons:
    """``item.neurons`` in any form :func:`~interp.interventions.neuron_sets.neuron_set` reads (dict,
    ``"2:17,2:101"``, a neurons.json path, a neurons study result), normalised; where it came from is kept on
    ``item`` so ``setup`` can refuse neurons ranked on another model (unless ``item.force``)."""
    nset = neuron_set(item.neurons)
    item._ranked_on = nset
    return normalize_neurons(nset.neurons)


def check_neurons(neurons: Neurons, n_layers: int, d_mlp: Union[int, Sequence[int]]) -> None:
    """Raise :class:`InterpError` when a layer or neuron index does not exist in the model (``d_mlp``: the MLP
    width of every block, or one width per block for a pyramid model)."""
    widths = [int(d_mlp)] * n_layers if isinstance(d_mlp, int) else [int(w) for w in d_mlp]
    for layer, idx in neurons.items():
        if layer >= n_layers:
            raise InterpError(f"layer {layer} does not exist: the model has blocks 0..{n_layers - 1}")
        if max(idx) >= widths[layer]:
            raise InterpError(f"neuron {max(idx)} in layer {layer} does not exist: the MLP has {widths[layer]} "
                              f"neurons (0..{widths[layer] - 1})")


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
        n_layers, d_mlp: model sizes, for validating neuron indices (``d_mlps``: one MLP width per block where
            they differ, as in a pyramid model; empty: every block has ``d_mlp``).
        blocks: each block's hook-name prefix in forward order (an edit named by its block finds its index).
    """

    base_prefix: int
    n_prefix: int
    extra_start: Optional[int]
    n_layers: int
    d_mlp: int
    d_mlps: Tuple[int, ...] = ()
    blocks: Tuple[str, ...] = ()  # each block's hook-name prefix, in forward order (``stages.1.blocks.0``...)

    def check_neurons(self, neurons: Neurons) -> None:
        """:func:`check_neurons` against this model's blocks."""
        check_neurons(neurons, self.n_layers, self.d_mlps or self.d_mlp)


def edit_context(family, base_prefix: int, n_prefix: int, extra_start: Optional[int]) -> EditContext:
    """The :class:`EditContext` of a model of ``family`` (its block count and MLP widths)."""
    blocks = tuple(prefix for prefix, _ in family.blocks())
    widths = tuple(family.d_mlp(i) for i in range(len(blocks)))
    return EditContext(base_prefix=base_prefix, n_prefix=n_prefix, extra_start=extra_start, n_layers=len(widths),
                       d_mlp=widths[0] if widths else 0, d_mlps=widths if len(set(widths)) > 1 else (),
                       blocks=blocks)


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

    def resid_edits(self, ctx: EditContext) -> Dict[int, nn.Module]:
        return {}

    # ------------------------------------------------------------------ serialisation
    def params(self) -> Dict[str, Any]:
        raise NotImplementedError

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {}

    @classmethod
    def from_params(cls, params: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "Intervention":
        return cls(**params)

    def to_spec(self) -> Dict[str, Any]:
        """A JSON-able spec entry (``interp.interventions.spec``): kind, params, tensors as nested lists."""
        tensors = {name: t.tolist() for name, t in self.tensors().items()}
        return {"kind": self.kind, **self.params(), **({"tensors": tensors} if tensors else {})}

    @classmethod
    def from_spec(cls, spec: Dict[str, Any], inputs) -> "Intervention":
        """From a spec entry without ``kind``. ``inputs`` (``spec.SpecInputs``) gives the model's grid and
        calibration images to kinds whose spec form asks for them (they override this)."""
        spec = dict(spec)
        tensors = {name: torch.as_tensor(value) for name, value in spec.pop("tensors", {}).items()}
        return cls.from_params(spec, tensors)

    def weight_constants(self) -> Optional[Dict[int, Dict[int, float]]]:
        """``{block: {neuron: c}}`` if this edit sets MLP neurons to constants on every token (foldable into
        ``fc2``, see ``export.export_weights``), else None."""
        return None

    # ------------------------------------------------------------------ hooked path (InterventionMixin protocol)
    def setup(self, model, state: EditState) -> EditState:
        """``state`` with this intervention's structural edits added; records where its test-time registers go.

        Args:
            model: the ``HookedViT`` being edited (read only: sizes, layout, device).
            state: the edit state built so far (the model's current one plus earlier interventions').

        Raises:
            InterpError: already applied (nested ``intervene`` with the same object), or a second pooling edit.
        """
        if getattr(self, "_applied", False):
            raise InterpError(f"this {self.kind} is already applied (nested intervene?); pass a copy instead")
        ranked = getattr(self, "_ranked_on", None)
        if ranked is not None and ranked.fingerprint and getattr(self, "_checked_on", None) != id(model):
            check_ranked_on(ranked, model, force=bool(getattr(self, "force", False)))
            self._checked_on = id(model)  # weights fingerprints cost a pass over the weights: once per model
        device = model_device(model)
        pool = self.pool_module()
        new = state.add_tokens(self.n_extra_tokens).add_kv(self.extra_kv(), device)
        if pool is not None:
            new = new.set_pool(pool.to(device).pool_with_votes)
        base_prefix = model.base_layout.n_prefix
        self._extra_start = base_prefix + state.n_extra_tokens if self.n_extra_tokens else None
        self._applied = True
        return new

    def attach(self, model) -> List[Tuple[str, Any]]:
        """Forward hooks running this intervention's MLP edits on block ``layer``'s ``mlp.hook_post`` and its
        block-output edits on its ``hook_resid_post``."""
        ctx = edit_context(model.family, model.base_layout.n_prefix, model.layout.n_prefix,
                           getattr(self, "_extra_start", None))
        device = model_device(model)
        names = model.block_names
        hooks = []
        for layer, edit in self.mlp_edits(ctx).items():
            edit = edit.to(device)
            hooks.append((names.mlp_post(layer), lambda h, hook, edit=edit: edit(h)))
        for layer, edit in self.resid_edits(ctx).items():
            edit = edit.to(device)
            hooks.append((names.resid_post(layer), lambda x, hook, edit=edit: edit(x)))
        return hooks

    def teardown(self, model) -> None:
        """Forget what ``setup`` recorded (``intervene`` itself restores the model's previous edit state)."""
        self._applied, self._extra_start = False, None
