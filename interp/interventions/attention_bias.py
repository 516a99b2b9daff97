"""``AttentionBias``: the test-time register as one fixed extra key/value column per layer and head.

Calibrate on images with :class:`~interp.interventions.TestTimeRegister`, recording the register token's
key (after ``k_norm``, as attention sees it) and value at every block, averaged over images; apply by
zeroing the register neurons on the patches and appending (k', v') to every block's attention, with no
extra token.

>>> bias = AttentionBias.calibrate(model, images[:2], neurons={2: [17, 101, 402, 655]})   # calibration set
>>> logits = model.run_with_interventions(images[2:], [bias])                               # held-out images
>>> logits.shape
torch.Size([2, 10])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..errors import InterpError
from .ablation import tensor_batches
from .base import STRUCTURAL, EditContext, Intervention, Neurons, check_choice, check_neurons, normalize_neurons
from .edits import PATCH_FILLS
from .modules import RegisterNeuronEdit
from .register import TestTimeRegister


@dataclass(eq=False)
class AttentionBias(Intervention):
    """Register neurons moved out of the patches, and their register replaced by fixed key/value columns.

    Args:
        neurons: ``{layer: [neuron, ...]}`` register neurons, zeroed (``patch_fill``) on the patch tokens.
        keys, values: ``{block: Tensor[heads, m, head_dim]}``, m = registers calibrated (usually 1).
        patch_fill: as :class:`TestTimeRegister` (``"zero"``, ``"mean"``, ``"outliers"``).
        layers: blocks that get the extra column; None = every block in ``keys``.
    """

    neurons: Neurons
    keys: Dict[int, torch.Tensor] = field(repr=False)
    values: Dict[int, torch.Tensor] = field(repr=False)
    patch_fill: str = "zero"
    layers: Optional[List[int]] = None

    kind = "AttentionBias"
    stage = STRUCTURAL

    def __post_init__(self):
        self.neurons = normalize_neurons(self.neurons)
        check_choice("patch_fill", self.patch_fill, PATCH_FILLS)
        self.keys = {int(l): torch.as_tensor(k).float() for l, k in sorted(self.keys.items())}
        self.values = {int(l): torch.as_tensor(v).float() for l, v in sorted(self.values.items())}
        if set(self.keys) != set(self.values):
            raise ValueError("keys and values must cover the same blocks")
        for l in self.keys:
            if self.keys[l].dim() != 3 or self.keys[l].shape != self.values[l].shape:
                raise ValueError(f"keys[{l}] and values[{l}] must both be [heads, m, head_dim]")
        if self.layers is not None:
            self.layers = sorted(int(l) for l in self.layers)
            missing = [l for l in self.layers if l not in self.keys]
            if missing:
                raise ValueError(f"layers {missing} have no calibrated key/value; calibrated: {list(self.keys)}")

    def extra_kv(self) -> Dict[int, Tuple[torch.Tensor, torch.Tensor]]:
        layers = list(self.keys) if self.layers is None else self.layers
        return {l: (self.keys[l], self.values[l]) for l in layers}

    def mlp_edits(self, ctx: EditContext):
        ctx.check_neurons(self.neurons)
        bad = [l for l in self.extra_kv() if l >= ctx.n_layers]
        if bad:
            raise InterpError(f"key/value columns for blocks {bad}, but the model has blocks 0..{ctx.n_layers - 1}")
        return {layer: RegisterNeuronEdit(idx, ctx.n_prefix, None, 0, "layer_max", self.patch_fill)
                for layer, idx in self.neurons.items()}

    # ------------------------------------------------------------------ serialisation
    def params(self) -> Dict[str, Any]:
        return {"neurons": {str(l): idx for l, idx in self.neurons.items()}, "patch_fill": self.patch_fill,
                "layers": self.layers}

    def tensors(self) -> Dict[str, torch.Tensor]:
        out = {f"keys.{l}": k for l, k in self.keys.items()}
        out.update({f"values.{l}": v for l, v in self.values.items()})
        return out

    @classmethod
    def from_params(cls, params, tensors):
        keys = {int(n.split(".")[1]): t for n, t in tensors.items() if n.startswith("keys.")}
        values = {int(n.split(".")[1]): t for n, t in tensors.items() if n.startswith("values.")}
        return cls(**params, keys=keys, values=values)

    @classmethod
    def from_spec(cls, spec, inputs):
        """Spec forms: ``"keys"``/``"values"`` as ``{"block": [[[...]]]}``; without them, calibrated on ``inputs``
        (the spec may give ``n_registers``/``value`` of the register to imitate)."""
        if "tensors" in spec:
            return super().from_spec(spec, inputs)
        if "keys" not in spec:
            return cls.calibrate(inputs.model, inputs.images(cls.kind), batch_size=inputs.batch_size, **spec)
        return cls(**spec)

    # ------------------------------------------------------------------ calibration
    @classmethod
    @torch.no_grad()
    def calibrate(
        cls,
        model,
        images: Union[torch.Tensor, Iterable[torch.Tensor]],
        neurons: Mapping[int, Sequence[int]],
        n_registers: int = 1,
        value: str = "layer_max",
        patch_fill: str = "zero",
        batch_size: int = 32,
        layers: Optional[Sequence[int]] = None,
    ) -> "AttentionBias":
        """Average key and value of the test-time register(s) at every block, over ``images``.

        Args:
            model: the ``HookedViT``.
            images: calibration images [n, 3, H, W] (or an iterable of batches).
            neurons: register neurons ``{layer: [neuron, ...]}``.
            n_registers, value, patch_fill: the :class:`TestTimeRegister` to imitate.
            batch_size: images per forward pass.
            layers: blocks that get the column at inference (None = all blocks; all are calibrated).
        """
        register = TestTimeRegister(neurons, n_registers=n_registers, value=value, patch_fill=patch_fill)
        sums: Dict[str, Dict[int, torch.Tensor]] = {"k": {}, "v": {}}
        rows = slice(0, 0)

        names = model.block_names

        def record(t, hook):  # t [b, t, h, dh]; keep the register rows summed over images
            block = names.block_of(hook.name)
            part = sums[hook.name[-1]]
            total = t[:, rows].double().sum(dim=0).transpose(0, 1).cpu()  # [h, m, dh]
            part[block] = part[block] + total if block in part else total

        device = next(model.parameters()).device
        n_images = 0
        with model.intervene(register):
            start = register._extra_start
            rows = slice(start, start + n_registers)
            hooks = [(h, record) for h in names.every("attn.hook_k") + names.every("attn.hook_v")]
            for batch in tensor_batches(images, batch_size):
                model.run_with_hooks(batch.to(device), fwd_hooks=hooks)
                n_images += batch.shape[0]
        if n_images == 0:
            raise InterpError("no calibration images")
        keys = {l: (s / n_images).float() for l, s in sums["k"].items()}
        values = {l: (s / n_images).float() for l, s in sums["v"].items()}
        return cls(register.neurons, keys=keys, values=values, patch_fill=patch_fill,
                   layers=None if layers is None else list(layers))
