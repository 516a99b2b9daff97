"""The gradient forward of the attribution methods: one forward of a live model with the values of chosen hooks
kept, then one backward of a per-image objective to them (attribution patching, gradient-weighted attention
relevance). The one place the studies take gradients; like :func:`~interp.runtime.forward.run_hooks` it moves the
images to the model's device and dtype and applies the interventions for this forward only.

>>> run = run_with_grads(model, images, ["blocks.2.hook_resid_post"], lambda out: out.logits[:, 3])
>>> run.acts["blocks.2.hook_resid_post"].shape == run.grads["blocks.2.hook_resid_post"].shape   # [b, t, d]
True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Sequence

import torch

from ..models.classifiers.classifier import HOOK_POOLED
from .forward import model_input


@dataclass
class GradRun:
    """What one gradient forward kept (float32 CPU tensors).

    Attributes:
        acts: hook -> its value [b, ...]; grads: hook -> d(sum of the objective) / d(value), same shape.
        logits: [b, C] the head's output; pooled: [b, d'] ``hook_pooled``; value: [b] the objective.
    """

    acts: Dict[str, torch.Tensor]
    grads: Dict[str, torch.Tensor]
    logits: torch.Tensor
    pooled: torch.Tensor
    value: torch.Tensor


@dataclass
class Outputs:
    """What an objective reads: the forward's logits [b, C] and pooled vector [b, d'] (with their graph)."""

    logits: torch.Tensor
    pooled: torch.Tensor


def run_with_grads(model, x: torch.Tensor, hooks: Sequence[str], objective: Callable[[Outputs], torch.Tensor],
                   interventions: Sequence = ()) -> GradRun:
    """One forward of ``model`` on ``x`` [b, 3, H, W] under ``interventions`` keeping ``hooks``, then the backward
    of ``objective(outputs).sum()`` ([b] per image: images do not mix, so each image's gradient is its own)."""
    hooks = list(dict.fromkeys(hooks))
    x = model_input(model, x)
    kept: Dict[str, torch.Tensor] = {}

    def keep(tensor, hook):
        kept[hook.name] = tensor
        return tensor

    with torch.enable_grad(), model.intervene(*interventions):
        x = x.detach().requires_grad_(True)  # a graph even when the weights are frozen
        fwd = [(h, keep) for h in dict.fromkeys(hooks + [HOOK_POOLED])]
        logits = model.run_with_hooks(x, fwd_hooks=fwd)
        value = objective(Outputs(logits, kept[HOOK_POOLED]))
        grads = torch.autograd.grad(value.sum(), [kept[h] for h in hooks]) if hooks else ()
    return GradRun({h: kept[h].detach().float().cpu() for h in hooks},
                   {h: g.detach().float().cpu() for h, g in zip(hooks, grads)},
                   logits.detach().float().cpu(), kept[HOOK_POOLED].detach().float().cpu(),
                   value.detach().float().cpu())
