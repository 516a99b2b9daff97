"""``NeuronAblation``: set chosen MLP neurons to zero or to their mean activation.

>>> ablation = NeuronAblation({2: [17, 101]})                      # zero, every token
>>> mean_ablation = NeuronAblation.calibrate_means(model, images, {2: [17, 101]})
>>> logits = model.run_with_interventions(images, [mean_ablation])
>>> mean_ablation.mode, logits.shape
('mean', torch.Size([4, 10]))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..errors import InterpError
from .base import NEURON, EditContext, Intervention, Neurons, check_choice, check_neurons, normalize_neurons, take_neurons
from .edits import ABLATION_MODES, TOKEN_SETS, Donors
from .modules import AblationEdit


@dataclass(eq=False)
class NeuronAblation(Intervention):
    """Replace MLP neurons (activation after the non-linearity, ``blocks.{l}.mlp.hook_post``) by 0, their mean or
    another image's values.

    Args:
        neurons: ``{layer: [neuron, ...]}``, ``"2:17,2:101"``, a neurons.json path or a neurons study result.
        mode: ``"zero"``, ``"mean"`` (needs ``means``; see :meth:`calibrate_means`) or ``"resample"``: each image
            takes another image's values of these neurons on the same tokens (a derangement of the batch drawn with
            ``seed``; a batch of one image takes an image of the previous batch, another image when the batches are
            consecutive images of one set). Resampling is the one mode whose values depend on the other images.
        tokens: ``"all"`` tokens, or only ``"patches"`` (CLS and registers keep their values).
        means: ``{layer: Tensor[k]}``, one mean per listed neuron, in the order of ``neurons[layer]``.
        force: use neurons a neurons study ranked on another model's weights (refused by default).
        seed: the resampling's generator seed.
    """

    neurons: Neurons
    mode: str = "zero"
    tokens: str = "all"
    means: Optional[Dict[int, torch.Tensor]] = field(default=None, repr=False)
    force: bool = field(default=False, repr=False)
    seed: int = 0

    kind = "NeuronAblation"
    stage = NEURON

    def __post_init__(self):
        self._donors = Donors(self.seed)  # resample's draws, over every forward
        self.neurons = take_neurons(self)
        check_choice("mode", self.mode, ABLATION_MODES)
        check_choice("tokens", self.tokens, TOKEN_SETS)
        if self.mode == "mean":
            if self.means is None:
                raise ValueError("mode='mean' needs means={layer: Tensor[k]}; compute them with "
                                 "NeuronAblation.calibrate_means(model, images_or_cache, neurons)")
            self.means = {int(l): torch.as_tensor(m, dtype=torch.float32).reshape(-1) for l, m in self.means.items()}
            for layer, idx in self.neurons.items():
                if layer not in self.means or self.means[layer].numel() != len(idx):
                    raise ValueError(f"means[{layer}] must hold one value per neuron of neurons[{layer}] ({len(idx)})")
        elif self.means is not None:
            raise ValueError("means are only used with mode='mean'")

    def mlp_edits(self, ctx: EditContext):
        ctx.check_neurons(self.neurons)
        return {layer: AblationEdit(idx, ctx.n_prefix, self.mode, self.tokens,
                                    None if self.means is None else self.means[layer],
                                    (lambda sel, layer=layer: self._donors.draw(layer, sel)) if self.mode == "resample"
                                    else None)
                for layer, idx in self.neurons.items()}

    # ------------------------------------------------------------------ serialisation
    def params(self) -> Dict[str, Any]:
        return {"neurons": {str(l): idx for l, idx in self.neurons.items()}, "mode": self.mode, "tokens": self.tokens,
                **({"seed": self.seed} if self.mode == "resample" else {})}

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {} if self.means is None else {f"means.{l}": m for l, m in self.means.items()}

    @classmethod
    def from_params(cls, params, tensors):
        means = {int(name.split(".")[1]): t for name, t in tensors.items() if name.startswith("means.")} or None
        return cls(**params, means=means)

    @classmethod
    def from_spec(cls, spec, inputs):
        """Spec forms: ``"means": {"layer": [...]}``; ``mode="mean"`` without means calibrates on ``inputs``."""
        if "tensors" in spec:
            return super().from_spec(spec, inputs)
        if spec.get("mode") == "mean" and "means" not in spec:
            return cls.calibrate_means(inputs.model, inputs.images(cls.kind), spec["neurons"],
                                       tokens=spec.get("tokens", "all"), batch_size=inputs.batch_size)
        return cls(**spec)

    def weight_constants(self):
        """Full-token ablations set each neuron to 0 or its mean on every token: a weight edit."""
        if self.tokens != "all" or self.mode == "resample":
            return None
        return {layer: dict(zip(idx, [0.0] * len(idx) if self.mode == "zero" else self.means[layer].tolist()))
                for layer, idx in self.neurons.items()}

    # ------------------------------------------------------------------ calibration
    @classmethod
    def calibrate_means(
        cls,
        model,
        source: Union[torch.Tensor, Iterable[torch.Tensor], Any],
        neurons: Mapping[int, Sequence[int]],
        tokens: str = "all",
        batch_size: int = 32,
    ) -> "NeuronAblation":
        """A ``mode="mean"`` ablation whose means are each neuron's average activation on ``source``.

        Args:
            model: the ``HookedViT`` (with a cache it is only used for the token layout when the reader has none).
            source: images [n, 3, H, W], an iterable of image batches, or an activation cache reader
                (duck-typed, as ``interp.cache``'s): ``reader.batches(hook, batch_size)`` yielding
                ``(rows, array [n_i, t', d_mlp])`` (or bare arrays) for ``blocks.{l}.mlp.hook_post``;
                optional ``reader.meta["token_rows"]`` = [start, stop) of the stored token rows and
                ``reader.layout``.
            neurons: ``{layer: [neuron, ...]}``.
            tokens: average over ``"all"`` tokens or only ``"patches"`` (match the ablation's ``tokens``).
            batch_size: images per forward pass.
        """
        neurons = normalize_neurons(neurons)
        check_choice("tokens", tokens, TOKEN_SETS)
        if hasattr(source, "batches"):  # an activation cache reader
            means = _means_from_cache(source, neurons, tokens, batch_size, getattr(source, "layout", None) or
                                      model.layout, getattr(source, "blocks", None) or model.block_names)
        else:
            means = _means_from_images(model, source, neurons, tokens, batch_size)
        return cls(neurons, mode="mean", tokens=tokens, means=means)


def _average(batches: Iterable[torch.Tensor], idx: List[int], first_row: int) -> torch.Tensor:
    """Mean over images and token rows ``first_row:`` of columns ``idx`` of batches [n_i, t, d_mlp] -> [k] float32."""
    total, count = torch.zeros(len(idx), dtype=torch.float64), 0
    for batch in batches:
        sel = batch[:, first_row:, idx].double()
        total += sel.sum(dim=(0, 1)).cpu()
        count += sel.shape[0] * sel.shape[1]
    if count == 0:
        raise InterpError("no activations to average: the calibration source is empty")
    return (total / count).float()


def tensor_batches(images: Union[torch.Tensor, Iterable[torch.Tensor]], batch_size: int):
    """Split an image tensor [n, 3, H, W] into batches, or pass an iterable of batches through."""
    if isinstance(images, torch.Tensor):
        if images.dim() != 4 or images.shape[0] == 0:
            raise InterpError(f"calibration images must be a non-empty batch [n, 3, H, W], got {tuple(images.shape)}")
        return images.split(batch_size)
    return images


def _means_from_cache(reader, neurons: Neurons, tokens: str, batch_size: int, layout,
                      blocks) -> Dict[int, torch.Tensor]:
    """Means from a cache reader: ``reader.batches(hook, batch_size)`` yields (rows, array [n_i, t', d_mlp]) or
    arrays; ``reader.meta`` (optional) tells which token rows ``[start, stop)`` were stored."""
    meta = getattr(reader, "meta", None) or {}
    if meta.get("norms_only"):
        raise InterpError("this cache holds only token norms; mean ablation needs the activations of "
                          "blocks.{l}.mlp.hook_post (write the cache without norms_only)")
    start, stop = meta.get("token_rows") or (0, layout.n_tokens)
    if tokens == "all" and (start > 0 or stop < layout.n_tokens):
        raise InterpError(f"the cache stores token rows [{start}, {stop}) only; a mean over all tokens needs a "
                          "cache written with tokens='all' (or ablate tokens='patches')")
    if tokens == "patches" and (start > layout.n_prefix or stop <= layout.n_prefix):
        raise InterpError(f"the cache stores token rows [{start}, {stop}), not the patch rows "
                          f"[{layout.n_prefix}, {layout.n_tokens}); write it with tokens='patches' or 'all'")
    first_row = max(layout.n_prefix - start, 0) if tokens == "patches" else 0

    def arrays(hook):
        for item in reader.batches(hook, batch_size):
            yield torch.as_tensor(np.asarray(item[1] if isinstance(item, tuple) else item))

    return {l: _average(arrays(blocks.mlp_post(l)), idx, first_row) for l, idx in neurons.items()}


@torch.no_grad()
def _means_from_images(model, images, neurons: Neurons, tokens: str, batch_size: int):
    check_neurons(neurons, model.n_layers, [model.family.d_mlp(i) for i in range(model.n_layers)])
    first_row = model.layout.n_prefix if tokens == "patches" else 0
    device = next(model.parameters()).device
    collected: Dict[int, List[torch.Tensor]] = {l: [] for l in neurons}

    def keep(h, hook, layer):
        collected[layer].append(h[..., neurons[layer]].detach().cpu())

    hooks = [(model.block_names.mlp_post(l), lambda h, hook, l=l: keep(h, hook, l)) for l in neurons]
    for batch in tensor_batches(images, batch_size):
        model.run_with_hooks(batch.to(device), fwd_hooks=hooks)
    # Columns were already selected: average all of them.
    return {l: _average(collected[l], list(range(len(idx))), first_row) for l, idx in neurons.items()}
