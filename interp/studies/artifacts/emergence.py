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

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from ...errors import InterpError
from ...hooks.names import RESID_STAGES

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


class EmergenceAccumulator:
    """Running per-layer sums of per-image max/median patch norms and max CLS->patch attention."""

    def __init__(self, n_layers: int):
        self.n_layers = int(n_layers)
        self._max = {s: torch.zeros(self.n_layers, dtype=torch.float64) for s in STAGES}
        self._median = {s: torch.zeros(self.n_layers, dtype=torch.float64) for s in STAGES}
        self._count = {s: torch.zeros(self.n_layers, dtype=torch.long) for s in STAGES}
        self._attn = torch.zeros(self.n_layers, dtype=torch.float64)
        self._attn_count = torch.zeros(self.n_layers, dtype=torch.long)

    def _check(self, layer: int) -> None:
        if not 0 <= layer < self.n_layers:
            raise InterpError(f"layer {layer} is out of range for {self.n_layers} layers")

    def update(self, stage: str, layer: int, patch_norms: torch.Tensor) -> None:
        """Add one batch of patch-token norms [b, P] (patch tokens only) of ``blocks.{layer}.hook_{stage}``."""
        if stage not in STAGES:
            raise InterpError(f"stage {stage!r}: use one of {STAGES}")
        self._check(layer)
        norms = patch_norms.detach().cpu().to(torch.float64)
        if norms.ndim != 2 or norms.shape[1] == 0:
            raise InterpError(f"patch norms must be [b, P] with P > 0, got {tuple(norms.shape)}")
        self._max[stage][layer] += norms.max(dim=1).values.sum()
        self._median[stage][layer] += torch.quantile(norms, 0.5, dim=1).sum()
        self._count[stage][layer] += norms.shape[0]

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
        return EmergenceCurves(
            max_patch_norm={s: mean(self._max[s], self._count[s]) for s in STAGES},
            median_patch_norm={s: mean(self._median[s], self._count[s]) for s in STAGES},
            cls_attention_max=mean(self._attn, self._attn_count) if measured else None,
        )


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
