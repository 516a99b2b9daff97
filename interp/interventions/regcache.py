"""``RegCache``: cached outlier tokens as a middle-layer prefix of fixed key/value columns, never reaching the output
(Kim et al. 2025, "Activation Quantization of Vision Encoders Needs Prefixing Registers", arXiv 2510.04547;
docs/methods.md section 2, "Every training-free repair on one table").

The paper curates the outlier tokens of a middle layer (they are nearly the same in every image), prefixes them at
that layer with their key/value cached, and deletes them before the output. Its code (``spbob0418/RegCache``) was
not reachable when this was written, so this is interp's reading of the paper, not a transcription:

* calibration (:meth:`RegCache.calibrate`): on calibration images, the key and value (``attn.hook_k`` /
  ``attn.hook_v``, as attention sees them before any RoPE) of the given outlier patch tokens at every block from
  ``start`` on, averaged over those tokens and images: one cached token, [heads, 1, head_dim] per block;
* inference: those columns appended to the keys and values of blocks ``start .. L-1`` (every query may attend to
  them; they are no token of the sequence, so nothing of them reaches the output: "deleted before the output").

The paper's second step, deleting the residual sink tokens that still form among the patches, is not reproduced.

>>> outliers = model.run_with_cache(images)[1]["blocks.2.hook_resid_post"][:, 1:].norm(dim=-1) > 100  # Bool[N, P]
>>> cache = RegCache.calibrate(model, images, outliers, start=3)
>>> model.run_with_interventions(images, [cache]).shape
torch.Size([4, 10])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Tuple, Union

import torch

from ..errors import InterpError
from .ablation import tensor_batches
from .base import STRUCTURAL, Intervention


@dataclass(eq=False)
class RegCache(Intervention):
    """Fixed key/value columns at blocks ``keys`` (the cached prefix of the module doc).

    Args:
        keys, values: ``{block: Tensor[heads, m, head_dim]}``, the same blocks (m cached tokens, usually 1).
    """

    keys: Dict[int, torch.Tensor] = field(repr=False)
    values: Dict[int, torch.Tensor] = field(repr=False)

    kind = "RegCache"
    stage = STRUCTURAL

    def __post_init__(self):
        self.keys = {int(l): torch.as_tensor(k).float() for l, k in sorted(self.keys.items(), key=lambda kv: int(kv[0]))}
        self.values = {int(l): torch.as_tensor(v).float() for l, v in sorted(self.values.items(),
                                                                            key=lambda kv: int(kv[0]))}
        if not self.keys or set(self.keys) != set(self.values):
            raise ValueError("keys and values must cover the same, non-empty set of blocks")
        for l in self.keys:
            if self.keys[l].dim() != 3 or self.keys[l].shape != self.values[l].shape:
                raise ValueError(f"keys[{l}] and values[{l}] must both be [heads, m, head_dim]")

    @property
    def start(self) -> int:
        """The first block with the cached prefix."""
        return min(self.keys)

    def extra_kv(self) -> Dict[int, Tuple[torch.Tensor, torch.Tensor]]:
        return {l: (self.keys[l], self.values[l]) for l in self.keys}

    def params(self) -> Dict[str, Any]:
        return {}

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {**{f"keys.{l}": k for l, k in self.keys.items()}, **{f"values.{l}": v for l, v in self.values.items()}}

    @classmethod
    def from_params(cls, params, tensors):
        def part(prefix):
            return {int(n.split(".")[1]): t for n, t in tensors.items() if n.startswith(prefix)}

        return cls(keys=part("keys."), values=part("values."), **params)

    @classmethod
    @torch.no_grad()
    def calibrate(cls, model, images: Union[torch.Tensor, Iterable[torch.Tensor]], outliers: torch.Tensor,
                  start: int, batch_size: int = 32) -> "RegCache":
        """The mean key and value of the ``outliers`` patch tokens at blocks ``start .. L-1`` over ``images``.

        Args:
            model: the ``HookedViT`` (unedited).
            images: calibration images [N, 3, H, W] (or an iterable of batches, in order).
            outliers: Bool[N, P]: the outlier patch tokens of each image (e.g. a detection's ``outliers``).
            start: the first block that gets the cached prefix (``1 .. L-1``: the prefix enters in the middle).
        """
        names, n_layers = model.block_names, model.n_layers
        if not 1 <= start < n_layers:
            raise InterpError(f"RegCache start block {start}: the prefix enters a middle block, 1..{n_layers - 1}")
        if not bool(outliers.any()):
            raise InterpError("RegCache needs outlier tokens to cache: the mask holds none")
        sums: Dict[str, Dict[int, torch.Tensor]] = {"k": {}, "v": {}}
        rows: Dict[str, torch.Tensor] = {}

        def record(t, hook):  # t [b, t, h, dh]: sum over the batch's outlier patch rows -> [h, dh]
            block, part = names.block_of(hook.name), hook.name[-1]
            mask = rows["mask"].to(t.device)
            total = t[:, rows["patches"]][mask].double().sum(0).cpu()
            sums[part][block] = sums[part].get(block, 0) + total

        hooks = [(h, record) for l in range(start, n_layers) for h in (names.attn_k(l), names.attn_v(l))]
        device, seen, count = next(model.parameters()).device, 0, 0
        for batch in tensor_batches(images, batch_size):
            mask = outliers[seen:seen + len(batch)].bool()
            seen += len(batch)
            rows.update(mask=mask, patches=model.layout_for(tuple(batch.shape[-2:])).patch_slice)
            model.run_with_hooks(batch.to(device), fwd_hooks=hooks)
            count += int(mask.sum())
        if seen != len(outliers):
            raise InterpError(f"RegCache.calibrate: {seen} images but an outlier mask for {len(outliers)}")
        keys = {l: (s / count).float().unsqueeze(1) for l, s in sums["k"].items()}
        values = {l: (s / count).float().unsqueeze(1) for l, s in sums["v"].items()}
        return cls(keys=keys, values=values)
