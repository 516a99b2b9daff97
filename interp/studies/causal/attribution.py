"""Attribution patching (docs/causal.md): the first-order estimate of every activation-patching cell, from two
forwards and one backward (Nanda 2023; Syed et al. 2023).

>>> result = attribution_study(source, site="mlp_post", neurons="2:17,2:101,2:3", corruption="noise", progress=False)
>>> result.correlation > 0.9          # planted_vit: where the effect is linear the estimate agrees with patching
True

Denoising, the estimate of patching cell c (a token's row, a head, a neuron) is ``sum over c's entries of
grad * (clean - corrupted)``, the gradient of the metric taken in the corrupted run; noising, the gradient in the
clean run times ``(corrupted - clean)``. It estimates the change from the base run, so the value reported is the
base run's metric plus the estimate (the same scale as :class:`~interp.studies.causal.patching.PatchingResult`).
With ``compare`` the real patching sweep runs too and ``correlation`` is the Pearson correlation of the two
sets of normalised effects over every cell.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ..._progress import tqdm
from ...detection.detection import DetectionLike
from ...errors import InterpError
from ...runtime.source import n_batches
from ..declaration import study
from .configs import AttributionConfig
from .patching import SweepResult, patch_cells, prepare, sweep_result, sweep_setup
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
def attribution_study(source, config: AttributionConfig, *, detection: DetectionLike = None,
                      progress: bool = True) -> AttributionResult:
    """Attribution patching of every cell of the chosen sites on the images of a live ``source`` (module doc;
    the options are activation patching's, :class:`~interp.studies.causal.configs.AttributionConfig`)."""
    found, det, threshold, detect_layer = sweep_setup(source, config, detection, progress)
    est: Dict[int, torch.Tensor] = {}
    real: Dict[int, torch.Tensor] = {}
    clean = corrupted = 0.0
    count, layout = 0, None
    for start, x in tqdm(source.image_batches(), disable=not progress, desc="attribution", unit="batch",
                         total=n_batches(source, None), leave=False):
        prep = prepare(source, config, x, start, found, det, threshold)
        layout = prep.layout
        spec = prep.spec
        grads = source.run_with_grads(prep.base, [s.hook for s in found],
                                      lambda out: spec.score(out.logits, out.pooled)).grads
        base_value = prep.corrupted if config.direction == "denoise" else prep.clean
        for site in found:
            change = estimate(site, prep.donor_acts[site.hook], prep.base_acts[site.hook], grads[site.hook])
            est[site.block] = est.get(site.block, 0) + (change + base_value[:, None]).sum(0)
            if config.compare:
                real[site.block] = real.get(site.block, 0) + patch_cells(source, prep, site, config.cells, det).sum(1)
        clean += float(prep.clean.sum())
        corrupted += float(prep.corrupted.sum())
        count += len(x)
    if not count:
        raise InterpError("attribution patching needs at least one image")
    result = sweep_result(AttributionResult, source, config, found, est, clean / count, corrupted / count, count,
                          layout, threshold, detect_layer, [])
    if config.compare:
        patched = sweep_result(AttributionResult, source, config, found, real, clean / count, corrupted / count,
                               count, layout, threshold, detect_layer, [])
        result.patched, result.patched_normalized = patched.values, patched.normalized
        result.correlation = pearson(torch.tensor([v for row in result.normalized for v in row]),
                                     torch.tensor([v for row in patched.normalized for v in row]))
    result.params["compare"] = config.compare
    return result
