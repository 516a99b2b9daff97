"""Where high-norm tokens emerge, measured as Jiang et al. do (docs/methods.md section 2), streamed per batch.

Per layer and stage (``resid_mid``: after the attention step; ``resid_post``: after the MLP step):

* ``max_patch_norm``: the mean over images of each image's max patch-token norm (the reference notebook
  ``register_neurons.ipynb``, cell "Identify where outliers & attention sinks appear", tracks it on the
  block output);
* ``median_patch_norm``: the mean over images of each image's median patch-token norm;
* ``cls_attention_max``: the mean over images of each image's max over patches of the head-mean CLS->patch
  attention (the notebook's "Average Max Attention (CLS)").

The emergence step (:func:`find_emergence`) is the step (attention or MLP of one block) where the max patch
norm jumps relative to the median patch norm: a stream that grows everywhere is not an emergence.

Beside it, :func:`find_detected_emergence` follows the tokens the detection found (their positions, at every
step): the first step from which their log norms stay separated from the other patches' (Ashman's D >= 2 and
at least 2x the others' typical norm, the two-mode test's own bars) up to the detection block. It finds a 3x
artifact over a wide bulk, where the max-norm jump stays under its factor.

>>> acc = EmergenceAccumulator(n_layers=2)
>>> flat, spike = torch.ones(1, 4), torch.tensor([[1.0, 1.0, 1.0, 9.0]])    # patch norms [b, P]
>>> acc.update("resid_mid", 0, flat); acc.update("resid_post", 0, flat)
>>> acc.update("resid_mid", 1, flat); acc.update("resid_post", 1, spike)    # block 1's MLP makes an outlier
>>> acc.update_attention(1, torch.full((1, 3, 4), 0.25))                     # CLS->patch [b, h, P] or [b, P]
>>> found = find_emergence(acc.finalize(), artifacts_found=True)
>>> found["layer"], found["component"], found["jump"]
(1, 'mlp', 9.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from ...errors import InterpError
from ...hooks.names import RESID_STAGES
from ...detection.norm_split import MIN_MODE_RATIO, MIN_SEPARATION

STAGES = RESID_STAGES  # "resid_mid", "resid_post"


@dataclass
class EmergenceCurves:
    """Per-layer curves (means over the images); lists have one entry per layer (None: never measured).

    Attributes:
        max_patch_norm, median_patch_norm: stage (``resid_mid``/``resid_post``) -> [L].
        cls_attention_max: [L], or None when no attention was given.
    """

    max_patch_norm: Dict[str, List[Optional[float]]]
    median_patch_norm: Dict[str, List[Optional[float]]]
    cls_attention_max: Optional[List[Optional[float]]]
    detected: Optional[Dict[str, List[Optional[Dict]]]] = None


class EmergenceAccumulator:
    """Running per-layer sums of per-image max/median patch norms and max CLS->patch attention."""

    def __init__(self, n_layers: int):
        self.n_layers = int(n_layers)
        self._max = {s: torch.zeros(self.n_layers, dtype=torch.float64) for s in STAGES}
        self._median = {s: torch.zeros(self.n_layers, dtype=torch.float64) for s in STAGES}
        self._count = {s: torch.zeros(self.n_layers, dtype=torch.long) for s in STAGES}
        self._attn = torch.zeros(self.n_layers, dtype=torch.float64)
        self._attn_count = torch.zeros(self.n_layers, dtype=torch.long)
        # per stage, [L, 2 groups (detected, other), 3 moments (count, sum, sum of squares of log norm)]
        self._groups = {s: torch.zeros(self.n_layers, 2, 3, dtype=torch.float64) for s in STAGES}

    def _check(self, layer: int) -> None:
        if not 0 <= layer < self.n_layers:
            raise InterpError(f"layer {layer} is out of range for {self.n_layers} layers")

    def update(self, stage: str, layer: int, patch_norms: torch.Tensor,
               detected: Optional[torch.Tensor] = None) -> None:
        """Add one batch of patch-token norms [b, P] (patch tokens only) of ``blocks.{layer}.hook_{stage}``;
        ``detected``: Bool[b, P], the detection's outliers (at the detection block) of these images."""
        if stage not in STAGES:
            raise InterpError(f"stage {stage!r}: use one of {STAGES}")
        self._check(layer)
        norms = patch_norms.detach().cpu().to(torch.float64)
        if norms.ndim != 2 or norms.shape[1] == 0:
            raise InterpError(f"patch norms must be [b, P] with P > 0, got {tuple(norms.shape)}")
        self._max[stage][layer] += norms.max(dim=1).values.sum()
        self._median[stage][layer] += torch.quantile(norms, 0.5, dim=1).sum()
        self._count[stage][layer] += norms.shape[0]
        if detected is not None:
            logs = norms.clamp_min(1e-30).log()
            for g, mask in enumerate((detected, ~detected)):
                vals = logs[mask.to(torch.bool)]
                self._groups[stage][layer, g] += torch.stack([torch.tensor(float(vals.numel()), dtype=torch.float64),
                                                              vals.sum(), (vals ** 2).sum()])

    def update_attention(self, layer: int, cls_to_patches: torch.Tensor) -> None:
        """Add CLS->patch attention of one batch: [b, h, P] (averaged over heads here) or [b, P] head means."""
        self._check(layer)
        rows = cls_to_patches.detach().cpu().to(torch.float64)
        if rows.ndim == 3:
            rows = rows.mean(dim=1)
        if rows.ndim != 2:
            raise InterpError(f"CLS->patch attention must be [b, h, P] or [b, P], got {tuple(rows.shape)}")
        self._attn[layer] += rows.max(dim=1).values.sum()
        self._attn_count[layer] += rows.shape[0]

    def finalize(self) -> EmergenceCurves:
        def mean(total: torch.Tensor, count: torch.Tensor) -> List[Optional[float]]:
            return [float(t / c) if c > 0 else None for t, c in zip(total, count)]

        measured = bool((self._attn_count > 0).any())
        grouped = any(bool((self._groups[s][:, 0, 0] > 0).any()) for s in STAGES)
        return EmergenceCurves(
            max_patch_norm={s: mean(self._max[s], self._count[s]) for s in STAGES},
            median_patch_norm={s: mean(self._median[s], self._count[s]) for s in STAGES},
            cls_attention_max=mean(self._attn, self._attn_count) if measured else None,
            detected={s: [_separation(g) for g in self._groups[s]] for s in STAGES} if grouped else None,
        )


def _separation(moments: torch.Tensor) -> Optional[Dict]:
    """{"separation" (Ashman's D), "ratio"} of the detected vs the other tokens' log norms, from their
    [2, 3] moments (count, sum, sum of squares); None when either group is empty."""
    (n1, s1, q1), (n0, s0, q0) = moments.tolist()
    if n1 < 1 or n0 < 1:
        return None
    m1, m0 = s1 / n1, s0 / n0
    v1, v0 = max(q1 / n1 - m1 * m1, 0.0), max(q0 / n0 - m0 * m0, 0.0)
    d = math.sqrt(2) * (m1 - m0) / max(math.sqrt(v1 + v0), 1e-12)
    return {"separation": d, "ratio": math.exp(m1 - m0)}


def find_detected_emergence(curves: EmergenceCurves, detect_layer: int, *, artifacts_found: bool = True,
                            min_separation: float = MIN_SEPARATION, min_ratio: float = MIN_MODE_RATIO) -> Optional[Dict]:
    """The first step (attention or MLP of one block) from which the detected tokens stay separated from the
    other patch tokens through ``detect_layer``'s output: Ashman's D of their log norms >= ``min_separation``
    and their geometric-mean norm >= ``min_ratio`` x the others' at that step and every later one.

    Returns:
        None (no artifacts, nothing detected, or never separated), or ``{"layer", "component", "separation",
        "ratio", "min_separation", "min_ratio", "steps"}`` (``steps``: ``[layer, component, D, ratio]`` at
        every point up to the detection block).
    """
    if not artifacts_found or curves.detected is None:
        return None
    steps = []
    for layer in range(min(detect_layer + 1, len(curves.detected["resid_post"]))):
        for stage, component in (("resid_mid", "attention"), ("resid_post", "mlp")):
            found = curves.detected[stage][layer]
            steps.append([layer, component, None if found is None else found["separation"],
                          None if found is None else found["ratio"]])
    first = None
    for i, (_, _, d, ratio) in enumerate(steps):
        if d is not None and d >= min_separation and ratio >= min_ratio:
            first = i if first is None else first
        else:
            first = None
    if first is None:
        return None
    layer, component, d, ratio = steps[first]
    return {"layer": layer, "component": component, "separation": d, "ratio": ratio,
            "min_separation": min_separation, "min_ratio": min_ratio, "steps": steps}


def find_emergence(curves: EmergenceCurves, *, factor: float = 2.0, artifacts_found: bool = True) -> Optional[Dict]:
    """The step where the max patch norm jumps relative to the median patch norm.

    The relative max ``r = max_patch_norm / median_patch_norm`` is followed along the stream: block 0 after
    attention, after MLP, block 1 after attention, ... A step's jump is ``r_after / r_before``; the emergence
    is the step with the largest jump (earliest on ties), provided it reaches ``factor``.

    Args:
        curves: from :meth:`EmergenceAccumulator.finalize` (both stages measured on every layer).
        artifacts_found: False (the detection found no artifacts) -> None, whatever the curves say.

    Returns:
        None, or ``{"layer", "component" ("attention"/"mlp"), "jump", "factor", "relative_max", "steps"}``,
        where ``relative_max`` is r at each point and ``steps`` lists ``[layer, component, jump]`` per step.
    """
    if not artifacts_found:
        return None
    points: List[float] = []
    labels: List[tuple] = []
    for layer in range(len(curves.max_patch_norm["resid_post"])):
        for stage, component in (("resid_mid", "attention"), ("resid_post", "mlp")):
            top, mid = curves.max_patch_norm[stage][layer], curves.median_patch_norm[stage][layer]
            if top is None or mid is None:
                raise InterpError(f"{stage} of layer {layer} was never measured; emergence needs both stages "
                                  "on every layer")
            points.append(top / max(mid, 1e-12))
            labels.append((layer, component))
    steps = [(lab, points[i] / max(points[i - 1], 1e-12)) for i, lab in enumerate(labels) if i > 0]
    if not steps:
        return None
    best = max(range(len(steps)), key=lambda i: (steps[i][1], -i))
    (layer, component), jump = steps[best]
    if jump < factor:
        return None
    return {"layer": layer, "component": component, "jump": jump, "factor": factor, "relative_max": points,
            "steps": [[lab[0], lab[1], j] for lab, j in steps]}


def largest_step(curves: Dict) -> Optional[Dict]:
    """The step of the relative max (max / median patch norm) that rises most, whatever its size and whether
    artifacts were found: ``{"layer", "component", "jump"}`` or None (fewer than two points). What a summary
    names beside "emergence: none", so that a profile that visibly jumps is not left unexplained.

    Args:
        curves: a norms result's ``emergence_curves`` (``max_patch_norm`` / ``median_patch_norm`` per stage).
    """
    found = find_emergence(EmergenceCurves(curves["max_patch_norm"], curves["median_patch_norm"], None),
                           factor=0.0)
    return None if found is None else {k: found[k] for k in ("layer", "component", "jump")}
