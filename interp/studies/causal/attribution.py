"""Attribution patching (docs/causal.md): the first-order estimate of every activation-patching cell, from two
forwards and one backward (Nanda 2023; Syed et al. 2023).

>>> result = attribution_study(source, site="z", metric="logit-diff", classes=(0, 1), corruption="noise", noise=0.5,
...                             progress=False)
>>> result.correlation > 0.9          # the heads write linearly into the logits: the estimate is real patching
True

Denoising, the estimate of patching cell c (a token's row, a head, a neuron) is ``sum over c's entries of
grad * (clean - corrupted)``, the gradient of the metric taken in the corrupted run; noising, the gradient in the
clean run times ``(corrupted - clean)``. It estimates the change from the base run, so the value reported is the
base run's metric plus the estimate (the same scale as :class:`~interp.studies.causal.patching.PatchingResult`).
With ``compare`` the real patching sweep runs too and ``correlation`` is the Pearson correlation of the two
sets of normalised effects over every cell.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from ...detection.detection import DetectionLike
from ..declaration import study
from .configs import AttributionConfig
from .patching import SweepResult, patch_cells, run_sweep
from .sweep import Site, pearson


@dataclass
class AttributionResult(SweepResult):
    """Result of :func:`attribution_study` (:class:`~interp.studies.causal.patching.SweepResult`: ``values`` and
    ``normalized`` are the estimates).

    Attributes:
        patched: the real patching sweep's values (per block, per cell) with ``compare``, else None;
            patched_normalized: its normalised effects.
        correlation: Pearson correlation of the estimated and the real normalised effects over every cell (None
            without ``compare`` or without spread).
    """

    study = "attribution"
    patched: Optional[List[List[float]]] = None
    patched_normalized: Optional[List[List[float]]] = None
    correlation: Optional[float] = None

    def console_lines(self, config=None) -> List[str]:
        lines = super().console_lines(config)
        if self.correlation is not None:
            lines.insert(1, f"correlation with real patching: {self.correlation:.3f}")
        return lines


def estimate(site: Site, donor: torch.Tensor, base: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The first-order change [b, cells] of patching each cell of ``site``: grad * (donor - base) summed over the
    cell's entries (a token's row; a head's or a neuron's every token)."""
    prod = grad * (donor - base)
    if site.axis == 1:
        per = prod.reshape(*prod.shape[:2], -1).sum(-1)  # [b, t]
    else:
        per = prod.sum(1)  # [b, h, dh] or [b, n]
        per = per.reshape(*per.shape[:2], -1).sum(-1)
    return per[:, site.cells]


@study(AttributionConfig)
def attribution_study(source, config: AttributionConfig, *, detection: DetectionLike,
                      progress: bool = True) -> AttributionResult:
    """Attribution patching of every cell of the chosen sites on the images of a live ``source`` (module doc;
    the options are activation patching's, :class:`~interp.studies.causal.configs.AttributionConfig`)."""
    def visit(prep, found, det):
        spec = prep.spec
        grads = source.run_with_grads(prep.base, [s.hook for s in found],  # one backward serves every site
                                      lambda out: spec.score(out.logits, out.pooled), prep.base_edits).grads
        base_value = prep.corrupted if config.direction == "denoise" else prep.clean
        out = {"estimate": {s.block: (estimate(s, prep.donor_acts[s.hook], prep.base_acts[s.hook], grads[s.hook])
                                      + base_value[:, None]).T for s in found}}
        if config.compare:
            out["patched"] = {s.block: patch_cells(source, prep, s, config.cells, det) for s in found}
        return out

    sweep = run_sweep(source, config, detection, progress, visit)
    result = sweep.result(AttributionResult, source, config, "estimate")
    if config.compare:
        patched = sweep.result(AttributionResult, source, config, "patched")
        result.patched, result.patched_normalized = patched.values, patched.normalized
        result.correlation = pearson(torch.tensor([v for row in result.normalized for v in row]),
                                     torch.tensor([v for row in patched.normalized for v in row]))
    result.params["compare"] = config.compare
    return result
