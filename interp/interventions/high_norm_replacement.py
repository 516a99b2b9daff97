"""``HighNormReplacement``: the high-norm patch tokens replaced at block outputs by their image's mean normal patch
token (a training-free repair; docs/methods.md section 2, "Every training-free repair on one table").

At the output of every block listed in ``thresholds``, per image, each patch token whose norm is above that block's
threshold gets the mean of the image's other patch tokens at that block (those at or below it); prefix tokens (CLS,
registers, test-time registers) are untouched. An image whose patches are all above the threshold is left as it is.
No calibration beyond the thresholds; one forward per image.

>>> edit = HighNormReplacement({2: 40.0, 3: 45.0})
>>> model.run_with_interventions(images, [edit]).shape
torch.Size([4, 10])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping

import math

import torch
from torch import nn

from ..errors import InterpError
from .base import NEURON, EditContext, Intervention


class MeanFill(nn.Module):
    """Block output [b, t, d] with its patch rows (after ``n_prefix``) above ``threshold`` in norm set to the mean of
    the image's patch rows at or below it."""

    def __init__(self, n_prefix: int, threshold: float):
        super().__init__()
        self.n_prefix, self.threshold = int(n_prefix), float(threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = x[:, self.n_prefix:]
        hot = patches.float().norm(dim=-1) > self.threshold  # [b, P]
        keep = (~hot).unsqueeze(-1).to(patches.dtype)
        mean = (patches * keep).sum(1, keepdim=True) / keep.sum(1, keepdim=True).clamp_min(1)
        fill = hot.unsqueeze(-1) & (~hot).any(1).view(-1, 1, 1)  # an image with no normal patch: left as it is
        out = x.clone()
        out[:, self.n_prefix:] = torch.where(fill, mean.expand_as(patches), patches)
        return out


@dataclass(eq=False)
class HighNormReplacement(Intervention):
    """Patch tokens above ``thresholds[block]`` at the output of ``block`` replaced by their image's mean normal patch.

    Args:
        thresholds: ``{block: norm}``, the blocks edited and the norm above which a patch token there is high-norm
            (e.g. each block's own two-mode split, as ``interp study repairs`` calibrates them).
    """

    thresholds: Mapping[int, float]

    kind = "HighNormReplacement"
    stage = NEURON

    def __post_init__(self):
        if not isinstance(self.thresholds, Mapping) or not self.thresholds:
            raise ValueError("thresholds must be a non-empty dict {block: norm}")
        self.thresholds = {int(b): float(t) for b, t in sorted(self.thresholds.items(), key=lambda kv: int(kv[0]))}
        bad = {b: t for b, t in self.thresholds.items() if b < 0 or not math.isfinite(t) or t <= 0}
        if bad:
            raise ValueError(f"thresholds {bad}: blocks are >= 0 and norms finite and positive")

    def resid_edits(self, ctx: EditContext) -> Dict[int, nn.Module]:
        if max(self.thresholds) >= ctx.n_layers:
            raise InterpError(f"block {max(self.thresholds)} does not exist: the model has blocks 0..{ctx.n_layers - 1}")
        return {block: MeanFill(ctx.n_prefix, t) for block, t in self.thresholds.items()}

    def params(self) -> Dict[str, Any]:
        return {"thresholds": {str(b): t for b, t in self.thresholds.items()}}
