"""What the repairs study measures on the unedited model before it repairs anything, and the repairs it builds.

:func:`block_pass` is one forward per image: every block's patch norms (each block's own high-norm threshold,
:func:`block_thresholds`) and the measured artifact direction per block (the mean of the detection's artifact tokens
minus the mean of the other patches at that block's output). :func:`build_repairs` makes each repair's edit, or
says why it cannot run on this model (n/a).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import math

import torch

from ...detection.thresholds import resolve_threshold
from ...interventions import AttentionBias, HighNormReplacement, RegCache, TestTimeRegister
from ...interventions.token_replacement import fix_reg_mean

REPAIRS = ("intact", "test_time_register", "attention_bias", "fix_reg_mean", "mean_replacement", "regcache", "tta")


@dataclass
class BlockPass:
    """The unedited model, per block: ``norms`` {block: [N, P]} patch norms, ``directions`` {block: [d] or None}
    measured artifact direction (None without artifact or normal tokens)."""

    norms: Dict[int, torch.Tensor]
    directions: Dict[int, Optional[torch.Tensor]]


@torch.no_grad()
def block_pass(source, outliers: torch.Tensor) -> BlockPass:
    """One forward per image of ``source``: every block's patch norms and measured artifact direction, the artifact
    tokens being ``outliers`` Bool[N, P] (the detection's)."""
    names = source.blocks
    hooks = [names.resid_post(b) for b in range(source.n_layers)]
    norms: Dict[str, List[torch.Tensor]] = {h: [] for h in hooks}
    sums = {h: {"hot": 0.0, "cold": 0.0} for h in hooks}
    n_hot = n_cold = 0
    for start, x in source.image_batches():
        mask = outliers[start:start + len(x)].bool()
        hot, cold = mask.unsqueeze(-1).float(), (~mask).unsqueeze(-1).float()

        def reduce(layout):
            def fn(t):
                p = t[:, layout.patch_slice].float()
                return {"norms": p.norm(dim=-1), "hot": (p * hot.to(p.device)).sum((0, 1)),
                        "cold": (p * cold.to(p.device)).sum((0, 1))}
            return {h: fn for h in hooks}

        run = source.run(x, hooks, reduce)
        for h in hooks:
            norms[h].append(run.acts[h]["norms"])
            for part in ("hot", "cold"):
                sums[h][part] = sums[h][part] + run.acts[h][part].double()
        n_hot, n_cold = n_hot + int(mask.sum()), n_cold + int((~mask).sum())
    directions = {b: (sums[h]["hot"] / n_hot - sums[h]["cold"] / n_cold).float() if n_hot and n_cold else None
                  for b, h in enumerate(hooks)}
    return BlockPass({b: torch.cat(norms[h]) for b, h in enumerate(hooks)}, directions)


def block_thresholds(norms: Dict[int, torch.Tensor], detect_layer: int, detect_value: float) -> Dict[int, float]:
    """{block: norm} for the blocks where the patch norms split into a separated high-norm mode (the automatic
    two-mode split of each block's own norms); the detection block keeps the detection's counting threshold."""
    out = {}
    for block, n in norms.items():
        if block == detect_layer:
            out[block] = float(detect_value)
            continue
        found = resolve_threshold(n.double().numpy(), "auto")
        if found.artifacts_found and math.isfinite(found.value):
            out[block] = float(found.value)
    return dict(sorted(out.items()))


@dataclass
class Repair:
    """One row of the table: its edits (None: it does not run, ``reason`` says why), its inference cost in forward
    passes per image and in what it adds, and what it was calibrated on."""

    interventions: Optional[list] = None
    reason: Optional[str] = None
    forwards: int = 1
    adds: str = "nothing"
    calibration: str = "none"
    params: Dict = field(default_factory=dict)


def build_repairs(source, neurons, outliers: torch.Tensor, thresholds: Dict[int, float], views: int,
                  regcache_block: Optional[int]) -> Dict[str, Repair]:
    """Each repair's edits on ``source``'s model (calibrated on the source's own images where it needs
    calibration), or why it is n/a (module doc of :mod:`interp.studies.repairs.repairs`)."""
    layout, n = source.layout, len(source.ids)
    bs, last = source.batch_size, source.n_layers - 1
    images = f"the study's own {n} images, 1 forward each"
    no_neurons = "n/a: no register neurons given (--neurons; find them with interp study neurons)"
    out = {"intact": Repair([])}
    if neurons is None:
        out["test_time_register"] = out["attention_bias"] = Repair(reason=no_neurons)
    else:
        out["test_time_register"] = Repair([TestTimeRegister(neurons)], adds="1 token")
        bias = source.calibrated(AttentionBias.calibrate, neurons, batch_size=bs)
        out["attention_bias"] = Repair([bias], adds="1 key/value column per block", calibration=images)
    if not layout.n_registers:
        out["fix_reg_mean"] = Repair(reason="n/a: the model has no registers")
    else:
        out["fix_reg_mean"] = Repair([source.calibrated(fix_reg_mean, bs)],
                                     calibration=images)
    out["mean_replacement"] = Repair([HighNormReplacement(thresholds)], calibration="the per-block thresholds "
                                     "(the study's detection pass)", params={"blocks": list(thresholds)})
    start = regcache_block if regcache_block is not None else min(thresholds) + 1
    if start > last:
        out["regcache"] = Repair(reason=f"n/a: the prefix would enter block {start}, after the last block {last} "
                                        "(the artifacts first appear at the last block)")
    else:
        cache = source.calibrated(RegCache.calibrate, outliers, start, bs)
        out["regcache"] = Repair([cache], adds=f"1 key/value column in blocks {start}-{last}", calibration=images,
                                 params={"start": start})
    out["tta"] = Repair([], forwards=views, adds=f"{views} views", calibration="none")
    return out
