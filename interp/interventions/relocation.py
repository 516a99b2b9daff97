"""``Relocation``: move register-neuron activity onto chosen patches (causal test of docs/methods.md section 2).

>>> from interp.interventions import Relocation, masks
>>> reloc = Relocation({2: [17, 101, 402, 655]}, target=masks.smiley(model.layout.grid))
>>> with model.intervene(reloc):
...     logits, cache = model.run_with_cache(images, names_filter="blocks.5.hook_resid_post")
>>> cache["blocks.5.hook_resid_post"].shape
torch.Size([4, 197, 192])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

import torch

from . import masks
from .base import NEURON, EditContext, Intervention, Neurons, check_choice, check_neurons, take_neurons
from .edits import VALUE_MODES
from .modules import RelocationEdit


@dataclass(eq=False)
class Relocation(Intervention):
    """At each listed layer, write the neurons' per-image value on the ``target`` patches and 0 on the others.

    Args:
        neurons: ``{layer: [neuron, ...]}``, ``"2:17,2:101"``, a neurons.json path or a neurons study result.
        target: bool mask [h, w] on the patch grid (:mod:`interp.interventions.masks`).
        value: ``"neuron_max"``: each neuron's maximum over the image's tokens (all rows, prefix included);
            ``"layer_max"``: one value per image and layer, the entry of largest |value| over all tokens and
            listed neurons, sign kept.
        force: use neurons a neurons study ranked on another model's weights (refused by default).

    Prefix tokens (CLS, registers) keep their values.
    """

    neurons: Neurons
    target: torch.Tensor
    value: str = "neuron_max"
    force: bool = field(default=False, repr=False)

    kind = "Relocation"
    stage = NEURON

    def __post_init__(self):
        self.neurons = take_neurons(self)
        check_choice("value", self.value, VALUE_MODES)
        self.target = torch.as_tensor(self.target).bool()
        if self.target.dim() != 2:
            raise ValueError(f"target must be a boolean patch grid [h, w], got shape {tuple(self.target.shape)}")

    def mlp_edits(self, ctx: EditContext):
        ctx.check_neurons(self.neurons)
        return {layer: RelocationEdit(idx, ctx.n_prefix, self.target, self.value) for layer, idx in self.neurons.items()}

    def params(self) -> Dict[str, Any]:
        return {"neurons": {str(l): idx for l, idx in self.neurons.items()}, "value": self.value}

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {"target": self.target}

    @classmethod
    def from_params(cls, params, tensors):
        return cls(**params, target=tensors["target"])

    @classmethod
    def from_spec(cls, spec, inputs):
        """Spec form: ``"target"`` in the one target grammar (:func:`interp.interventions.masks.parse_target`)."""
        if "tensors" in spec:
            return super().from_spec(spec, inputs)
        spec = dict(spec)
        spec["target"] = masks.parse_target(spec["target"], inputs.grid)
        return cls(**spec)
