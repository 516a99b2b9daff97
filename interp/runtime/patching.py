"""Activation patching's edit: a hook's values replaced by given ones where a mask says, for one forward.

:class:`ActivationPatch` follows the intervention protocol of :mod:`interp.hooks.intervene` (a ``stage`` and
``attach``), so a patched run is an ordinary :func:`~interp.runtime.forward.run_hooks` call with it among the
interventions: the device, the layout and the readout are decided there, as for every edited forward. It holds
tensors of one batch, so it is an in-memory edit, never written to a patch file.

A sweep batches its cells: the corrupted batch [b, ...] is repeated once per cell ([k * b, ...]) and cell i's
mask is True only at its own position (or head, or neuron) in the i-th copy (:func:`cell_masks`).

>>> from interp.runtime.forward import run_hooks
>>> x_clean, x_corrupt = images[:2], images[2:]
>>> clean = run_hooks(model, x_clean, ["blocks.2.hook_resid_post"]).acts["blocks.2.hook_resid_post"]
>>> mask = torch.zeros(*clean.shape[:2], 1, dtype=torch.bool); mask[:, 5] = True    # token 5 of every image
>>> patched = run_hooks(model, x_corrupt, logits=True,
...                     interventions=[ActivationPatch("blocks.2.hook_resid_post", clean, mask)])
>>> patched.logits.shape
torch.Size([2, 10])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Sequence, Tuple

import torch

NEURON_STAGE = 1  # runs with the neuron edits (interp.interventions.base.NEURON), after the structural ones


@dataclass(eq=False)
class ActivationPatch:
    """The values of ``hook`` replaced by ``values`` where ``mask`` is True.

    Attributes:
        hook: the exact hook name.
        values: [b, ...] the activation's shape (e.g. [b, t, d]; [b, t, h, dh] for ``attn.hook_z``).
        mask: bool, broadcastable to the activation ([b, t, 1] a token, [b, t, h, 1] a head at a token,
            [b, t, n] a neuron).
    """

    hook: str
    values: torch.Tensor
    mask: torch.Tensor
    stage: ClassVar[int] = NEURON_STAGE

    def attach(self, model) -> List[Tuple[str, object]]:
        def patch(t: torch.Tensor, hook) -> torch.Tensor:
            values = self.values.to(device=t.device, dtype=t.dtype)
            return torch.where(self.mask.to(t.device), values, t)

        return [(self.hook, patch)]


def cell_masks(shape: Sequence[int], axis: int, cells: Sequence[int], b: int) -> torch.Tensor:
    """Masks of a batched sweep: bool [len(cells) * b, *shape[1:]] (``shape`` = one activation's [b, ...]), copy i
    (rows ``i * b .. (i + 1) * b``) True exactly at index ``cells[i]`` of ``axis`` (1: token, 2: head or neuron
    of a [b, t, h, dh] / [b, t, n] activation; every token then), else False."""
    k = len(cells)
    mask = torch.zeros(k, b, *shape[1:], dtype=torch.bool)
    for i, cell in enumerate(cells):
        index = [i, slice(None)] + [slice(None)] * (len(shape) - 1)
        index[axis + 1] = cell
        mask[tuple(index)] = True
    return mask.reshape(k * b, *shape[1:])


def repeat_batch(x: torch.Tensor, k: int) -> torch.Tensor:
    """[b, ...] -> [k * b, ...]: ``x`` once per sweep cell (copy i is rows ``i * b .. (i + 1) * b``)."""
    return x.repeat(k, *([1] * (x.ndim - 1)))
