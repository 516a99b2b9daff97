"""The random controls of an SAE feature set (docs/sae.md): live features matched to the chosen ones by firing
rate and by firing on the high-norm tokens, outside the artifact component (the subspace, and features writing
along the artifact direction), drawn with a fixed seed; used by the ablation's controls and by the artifact rule's
isolation check (:func:`interp.sae.features.feature_report`)."""
from __future__ import annotations

import random
from typing import Any, Dict, List, Tuple

import numpy as np

from ..errors import InterpError

KINDS = ("normal_patch", "high_norm", "cls", "register")  # the report's token kinds (interp.sae.features)

MATCH_CANDIDATES = 5  # each control feature is drawn among the target's this many nearest matches ...
MATCH_HIGH_RATE = 0.25  # ... that fire on the high-norm tokens within this rate of the target ...
MATCH_LOG_RATE = 1.0  # ... and overall within this many decades (else any of the nearest, flagged unmatched)
ALIGNED_COS = 0.5  # a feature whose direction is this close to the artifact direction is never a control


def _overall_rate(report: Dict[str, Any], feature: Dict[str, Any]) -> float:
    """A feature's firing rate over every token kind the report read."""
    kinds = [k for k in report.get("analysed_kinds", KINDS) if report["n_tokens"].get(k)]
    total = sum(report["n_tokens"][k] for k in kinds)
    return sum((feature["rates"][k] or 0.0) * report["n_tokens"][k] for k in kinds) / total if total else 0.0


def aligned_features(report: Dict[str, Any]) -> List[int]:
    """Live features whose decoder direction lies within ``ALIGNED_COS`` of the artifact direction (the high-norm
    tokens' mean excess over the mean normal patch; ``cos_excess`` of the report): part of the artifact component
    whatever their firing, so never controls."""
    return [f["feature"] for f in report["features"]
            if f["alive"] and (f.get("cos_excess") or 0.0) >= ALIGNED_COS]


def control_features(report: Dict[str, Any], targets, n_controls: int, seed: int) -> List[List[int]]:
    """The control sets of :func:`matched_controls` (without the matched flags)."""
    return matched_controls(report, targets, n_controls, seed)[0]


def matched_controls(report: Dict[str, Any], targets, n_controls: int,
                     seed: int) -> Tuple[List[List[int]], List[bool]]:
    """``n_controls`` random feature sets of ``len(targets)`` matched to the targets (docs/sae.md): each target
    gets a live feature outside the targets and the artifact subspace, drawn among the
    ``MATCH_CANDIDATES`` nearest to it by firing rate (log scale) and by firing rate on the high-norm tokens that
    lie within ``MATCH_HIGH_RATE`` and ``MATCH_LOG_RATE`` of it (any of the nearest, flagged unmatched, when none
    does), so a control
    fires as often, and on the high-norm tokens as much, as what it stands for: it can remove outliers. Control i uses ``random.Random(seed + i)``.

    Returns:
        (the sets, whether each set's every feature lies within the calipers of the target it stands for).

    Raises:
        InterpError: fewer such features than targets.
    """
    chosen = {int(f) for f in targets}
    by_id = {f["feature"]: f for f in report["features"]}
    # the artifact component is no control: the subspace, and features writing along the artifact direction that
    # the count-based rule leaves out (dense or low-precision features whose code is large on the high-norm
    # tokens); enriched features pointing elsewhere stay in: they fire there without carrying the excess, the
    # controls that can show whether firing there is enough
    excluded = chosen | {int(f) for f in (report.get("artifact_subspace") or {}).get("features", [])} \
        | set(aligned_features(report))
    pool = [f["feature"] for f in report["features"] if f["alive"] and f["feature"] not in excluded]
    if n_controls and len(pool) < len(chosen):
        raise InterpError(f"only {len(pool)} live feature(s) outside the chosen ones and the artifact subspace for controls "
                          f"of {len(chosen)} feature(s) (of {report['n_alive']} alive); ablate fewer features, give "
                          "more images or use --controls 0")

    def signature(f: int):
        rate = _overall_rate(report, by_id[f])
        return np.log10(rate + 1e-6), by_id[f]["rates"].get("high_norm") or 0.0

    sig = {f: signature(f) for f in pool}
    nearest, targets_sig = {}, {}
    for t in sorted(chosen):
        lt, ht = targets_sig[t] = signature(t) if t in by_id else (0.0, 0.0)
        nearest[t] = sorted(pool, key=lambda f: (abs(sig[f][0] - lt) + 4 * abs(sig[f][1] - ht), f))
    out, matched = [], []
    for i in range(n_controls):
        rng, taken, ok = random.Random(seed + i), [], True
        for t in sorted(chosen):
            free = [f for f in nearest[t] if f not in taken]
            close = [f for f in free[:MATCH_CANDIDATES] if abs(sig[f][1] - targets_sig[t][1]) <= MATCH_HIGH_RATE
                     and abs(sig[f][0] - targets_sig[t][0]) <= MATCH_LOG_RATE]
            ok = ok and bool(close)
            taken.append(rng.choice(close or free[:MATCH_CANDIDATES]))
        out.append(sorted(taken))
        matched.append(ok)
    return out, matched


def coinciding_controls(controls: List[List[int]]) -> List[List[int]]:
    """Pairs ``[i, j]`` of control sets that are the same features (a small pool repeats itself)."""
    return [[i, j] for i in range(len(controls)) for j in range(i + 1, len(controls)) if controls[i] == controls[j]]
