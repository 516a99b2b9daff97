"""Register neurons (Jiang et al.; SCIENCE.md section 2): MLP neurons whose activation concentrates on
the high-norm tokens.

score[l, n] = mean over images with outliers of ( mean over outlier patches p of |a[l, n](p)| ),
a = ``blocks.{l}.mlp.hook_post`` (after the non-linearity; for SwiGLU the fc2 input). Outliers are the
patch tokens of ``detect_layer`` whose ``hook_resid_post`` norm exceeds the threshold; images without
outliers are skipped. Layers above ``highest_layer`` are ignored; the optional sparsity filter keeps a
neuron only if at least 50 % of all tokens (of the images used) have activation below 0.5.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from .outliers import ThresholdSpec, detection_norms, resolve_layer, resolve_threshold
from .result import StudyResult
from .source import ActivationSource, n_batches


def mlp_post(layer: int) -> str:
    return f"blocks.{layer}.mlp.hook_post"


@dataclass
class NeuronsResult(StudyResult):
    """Result of :func:`neurons_study`.

    Attributes:
        neurons: ``[{"layer", "neuron", "score"}]``, best first (at most ``top_k``; empty when nothing to rank).
        layer_max_score: per scored layer, its best neuron's score (how register-like each layer gets).
        message: why the list is empty, when it is.
    """

    study = "neurons"
    detect_layer: int = -1
    threshold: Optional[float] = None
    threshold_method: str = "auto"
    highest_layer: int = -1
    top_k: int = 10
    sparsity_filter: bool = False
    n_images: int = 0
    n_images_with_outliers: int = 0
    n_outlier_tokens: int = 0
    image_ids: List[str] = field(default_factory=list)
    neurons: List[Dict] = field(default_factory=list)
    layer_max_score: List[float] = field(default_factory=list)
    message: str = ""

    def neuron_dict(self) -> Dict[int, List[int]]:
        """``{layer: [neuron, ...]}`` of the ranked neurons (the form interventions take)."""
        out: Dict[int, List[int]] = {}
        for entry in self.neurons:
            out.setdefault(int(entry["layer"]), []).append(int(entry["neuron"]))
        return out


def neurons_study(
    source: ActivationSource,
    *,
    threshold: ThresholdSpec = "auto",
    detect_layer: Optional[int] = None,
    highest_layer: Optional[int] = None,
    top_k: int = 10,
    sparsity_filter: bool = False,
    max_images: Optional[int] = None,
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
) -> NeuronsResult:
    """Rank register neurons.

    Args:
        source: live model over images, or a cache holding ``blocks.*.mlp.hook_post`` (layers <= highest_layer)
            and the detection layer's ``hook_resid_post`` (full or ``--norms-only``... the norms cache must then
            be a separate file: pass the same images).
        threshold, detect_layer: as in the norms study (default: last block, automatic bimodal split).
        highest_layer: last layer whose neurons are scored (default: the detection layer).
        top_k: how many neurons to return.
        sparsity_filter: drop neurons active (>= 0.5) on more than half of all tokens.
        max_images: score on a seeded random subset of the images with outliers (the reference code samples
            without a seed; here the sample is deterministic for a seed).
    """
    n_layers = source.n_layers
    detect = resolve_layer(detect_layer, n_layers)
    highest = resolve_layer(highest_layer if highest_layer is not None else detect, n_layers)
    params = {"threshold": threshold, "detect_layer": detect, "highest_layer": highest, "top_k": top_k,
              "sparsity_filter": sparsity_filter, "max_images": max_images, "batch_size": batch_size}
    base = dict(model=source.model_name, fingerprint=source.fingerprint, params=params, seed=seed,
                detect_layer=detect, highest_layer=highest, top_k=top_k, sparsity_filter=sparsity_filter,
                n_images=len(source))

    det = detection_norms(source, detect, batch_size, progress)  # [N, P]
    thr = resolve_threshold(det.numpy().ravel(), threshold)
    outliers = det > thr.value
    with_outliers = torch.nonzero(outliers.any(1)).flatten().tolist()
    thr_value = thr.value if np.isfinite(thr.value) else None
    if thr.method == "auto" and not thr.bimodal or not with_outliers:
        reason = ("the detection layer's norm distribution has no separated high-norm mode"
                  if thr.method == "auto" and not thr.bimodal else "no patch token exceeds the threshold")
        return NeuronsResult(**base, threshold=thr_value, threshold_method=thr.method,
                             message=f"no outliers at block {detect}: {reason}; nothing to rank")
    if max_images is not None and len(with_outliers) > max_images:
        with_outliers = sorted(random.Random(seed).sample(with_outliers, max_images))
    chosen = set(with_outliers)

    hooks = [mlp_post(l) for l in range(highest + 1)]
    patches = source.layout.patch_slice
    score_sum: Optional[torch.Tensor] = None  # [L, d_mlp]
    below = None
    n_tokens = 0
    for batch in tqdm(source.batches(hooks, batch_size), disable=not progress, desc="neuron scores",
                      total=n_batches(source, batch_size), unit="batch", leave=False):
        keep = [j for j in range(len(batch)) if batch.start + j in chosen]
        if not keep:
            continue
        acts = torch.stack([batch.acts[h][keep] for h in hooks], dim=1)  # [b, L, t, d_mlp]
        mask = outliers[[batch.start + j for j in keep]].to(acts.dtype)  # [b, P]
        patch_acts = acts[:, :, patches].abs()  # [b, L, P, d_mlp]
        per_image = torch.einsum("blpn,bp->bln", patch_acts, mask) / mask.sum(1).view(-1, 1, 1)
        score_sum = per_image.sum(0) if score_sum is None else score_sum + per_image.sum(0)
        if sparsity_filter:
            b_below = (acts < 0.5).sum(dim=(0, 2))  # [L, d_mlp]
            below = b_below if below is None else below + b_below
            n_tokens += acts.shape[0] * acts.shape[2]
    scores = score_sum / len(with_outliers)  # [L, d_mlp]
    if sparsity_filter:
        scores = torch.where(below >= 0.5 * n_tokens, scores, torch.full_like(scores, -1.0))
    flat = scores.flatten()
    k = min(top_k, int((flat >= 0).sum()))
    values, idx = torch.sort(flat, descending=True, stable=True)  # ties: lower layer/index first
    values, idx = values[:k], idx[:k]
    d_mlp = scores.shape[1]
    ranked = [{"layer": int(i // d_mlp), "neuron": int(i % d_mlp), "score": float(v)} for v, i in zip(values, idx)]
    return NeuronsResult(
        **base, threshold=thr_value, threshold_method=thr.method,
        n_images_with_outliers=len(with_outliers), n_outlier_tokens=int(outliers[with_outliers].sum()),
        image_ids=[source.ids[i] for i in with_outliers], neurons=ranked,
        layer_max_score=[float(v) for v in scores.clamp_min(0).max(1).values],
    )
