"""High-norm tokens (Darcet et al.; SCIENCE.md sections 1-2): per-layer norm statistics of the
un-normalised residual stream, outlier detection, outlier maps, the emergence layer, and where CLS attends.

>>> result = norms_study(open_source(model=model, images="photos/"), threshold="auto")
>>> result.artifacts_found, result.emergence["layer"]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from .outliers import ThresholdSpec, detection_norms, resolve_layer, resolve_threshold, resid_post
from .result import StudyResult
from .source import ActivationSource, n_batches, token_norms

# Log-spaced norm histogram bins shared by every layer: ~0.5 % wide, from 1e-3 to 1e6.
HIST_EDGES = np.logspace(-3, 6, 4001)
STAGES = ("resid_mid", "resid_post")
KINDS = ("cls", "registers", "patches")


def _hist_quantile(counts: np.ndarray, q: float) -> Optional[float]:
    total = counts.sum()
    if total == 0:
        return None
    idx = int(np.searchsorted(np.cumsum(counts), q * total))
    idx = min(idx, len(counts) - 1)
    return float(np.sqrt(HIST_EDGES[idx] * HIST_EDGES[idx + 1]))


def _trim(counts: np.ndarray) -> Dict:
    """A histogram row without its empty ends: {"start": first bin index, "counts": [...]}."""
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return {"start": 0, "counts": []}
    return {"start": int(nz[0]), "counts": counts[nz[0]:nz[-1] + 1].tolist()}


@dataclass
class NormsResult(StudyResult):
    """Result of :func:`norms_study`.

    Attributes:
        stats: stage ("resid_mid"/"resid_post") -> kind ("cls"/"registers"/"patches") -> per-layer list of
            {"median", "p99", "max"} (median and p99 from ~0.5 %-wide log bins; max exact; None if no token).
        histograms: stage -> per layer {"start", "counts"}: patch-norm counts over ``hist_edges[start:]``
            (log-spaced bins; empty ends trimmed).
        threshold: outlier threshold at ``detect_layer`` (None = no outliers: distribution not bimodal under "auto").
        outlier_maps: [N][h][w] 0/1 outliers at ``detect_layer`` (patch tokens).
        outlier_fraction_per_layer: share of patch tokens above ``threshold`` at each block output.
        emergence: first layer whose attention or MLP raises the max patch norm by ``emergence_factor``:
            {"layer", "component", "factor", "attn_ratio": [...], "mlp_ratio": [...]} or None.
        cls_attention_max: per layer, max over images and patches of CLS->patch attention (head mean), or
            None when attention patterns were not available.
        cls_attention_on_outliers: per layer, mean share of CLS->patch attention on outlier patches.
    """

    study = "norms"
    ids: List[str] = field(default_factory=list)
    n_layers: int = 0
    grid: List[int] = field(default_factory=list)
    detect_layer: int = -1
    threshold: Optional[float] = None
    threshold_method: str = "auto"
    bimodal: bool = False
    mode_ratio: float = 1.0
    artifacts_found: bool = False
    outlier_fraction: float = 0.0
    outlier_counts: List[int] = field(default_factory=list)
    outlier_maps: List = field(default_factory=list)
    outlier_fraction_per_layer: List[float] = field(default_factory=list)
    stats: Dict = field(default_factory=dict)
    max_patch_norm: Dict[str, List[float]] = field(default_factory=dict)
    median_patch_norm: Dict[str, List[float]] = field(default_factory=dict)
    histograms: Dict = field(default_factory=dict)
    hist_edges: List[float] = field(default_factory=list)
    emergence: Optional[Dict] = None
    cls_attention_max: Optional[List[float]] = None
    cls_attention_on_outliers: Optional[List[float]] = None

    def outlier_map_tensor(self) -> torch.Tensor:
        """Outlier maps as Bool[N, h, w]."""
        return torch.tensor(self.outlier_maps, dtype=torch.bool).reshape(len(self.ids), *self.grid)


def find_emergence(max_pre: List[float], max_mid: List[float], max_post: List[float], factor: float) -> Optional[Dict]:
    """First layer where the attention (pre->mid) or the MLP (mid->post) step multiplies the max patch norm
    by at least ``factor``."""
    attn_ratio = [m / max(p, 1e-12) for p, m in zip(max_pre, max_mid)]
    mlp_ratio = [p / max(m, 1e-12) for m, p in zip(max_mid, max_post)]
    for layer, (a, m) in enumerate(zip(attn_ratio, mlp_ratio)):
        if a >= factor or m >= factor:
            component = "attention" if a >= m else "mlp"
            return {"layer": layer, "component": component, "factor": factor,
                    "attn_ratio": attn_ratio, "mlp_ratio": mlp_ratio}
    return None


def norms_study(
    source: ActivationSource,
    *,
    threshold: ThresholdSpec = "auto",
    detect_layer: Optional[int] = None,
    emergence_factor: float = 2.0,
    attention: bool = True,
    batch_size: int = 16,
    progress: bool = True,
) -> NormsResult:
    """Norm statistics per layer and token kind, outliers, emergence layer and CLS attention.

    Args:
        source: a live model over images, or a cache with ``blocks.*.hook_resid_mid``/``hook_resid_post``
            (full activations or ``--norms-only``); attention needs ``blocks.*.attn.hook_pattern`` (live: always).
        threshold: a norm, ``"pNN"`` (per-model percentile of the detection layer's patch norms) or ``"auto"``
            (bimodal split; no outliers when the distribution has no separated high-norm mode).
        detect_layer: block whose output decides outliers (default: the last; negative counts from the end).
        emergence_factor: how much one step must raise the max patch norm to count as emergence.
        attention: measure CLS->patch attention per layer (skipped for caches without patterns).
    """
    lay = source.layout
    n_layers = source.n_layers
    detect = resolve_layer(detect_layer, n_layers)

    det = detection_norms(source, detect, batch_size, progress)  # [N, P]
    thr = resolve_threshold(det.numpy().ravel(), threshold)
    outliers = det > thr.value  # [N, P]

    kinds = {"cls": slice(lay.cls_index, lay.cls_index + 1) if lay.cls_index is not None else slice(0, 0),
             "registers": lay.register_slice, "patches": lay.patch_slice}
    hooks = [f"blocks.{i}.hook_{s}" for i in range(n_layers) for s in STAGES]
    reduce = {h: token_norms for h in hooks}
    pattern_hooks = [f"blocks.{i}.attn.hook_pattern" for i in range(n_layers)]
    use_attention = attention and lay.cls_index is not None and all(source.has(h) for h in pattern_hooks) and (
        source.model is not None or not getattr(source, "norms_only", False))
    if use_attention:
        cls, patches = lay.cls_index, lay.patch_slice
        for h in pattern_hooks:
            reduce[h] = lambda p, c=cls, s=patches: p[:, :, c, s].float().mean(1)  # [b, P] head mean
        hooks += pattern_hooks

    counts = {s: {k: np.zeros((n_layers, len(HIST_EDGES) - 1), np.int64) for k in KINDS} for s in STAGES}
    maxima = {s: {k: np.full(n_layers, -np.inf) for k in KINDS} for s in STAGES}
    above = np.zeros(n_layers, np.int64)
    attn_max = np.zeros(n_layers)
    attn_share = np.zeros(n_layers)
    n_images = 0
    for batch in tqdm(source.batches(hooks, batch_size, reduce=reduce), disable=not progress,
                      total=n_batches(source, batch_size), desc="norms per layer", unit="batch", leave=False):
        out_b = outliers[batch.start:batch.start + len(batch)]
        for i in range(n_layers):
            for s in STAGES:
                norms = batch.acts[f"blocks.{i}.hook_{s}"]  # [b, t]
                for k, sl in kinds.items():
                    vals = norms[:, sl].reshape(-1).numpy()
                    if vals.size:
                        counts[s][k][i] += np.histogram(np.clip(vals, HIST_EDGES[0], HIST_EDGES[-1]),
                                                        HIST_EDGES)[0]
                        maxima[s][k][i] = max(maxima[s][k][i], float(vals.max()))
            above[i] += int((batch.acts[resid_post(i)][:, lay.patch_slice] > thr.value).sum())
            if use_attention:
                row = batch.acts[f"blocks.{i}.attn.hook_pattern"]  # [b, P]
                attn_max[i] = max(attn_max[i], float(row.max()))
                share = (row * out_b).sum(1) / row.sum(1).clamp_min(1e-12)
                attn_share[i] += float(share.sum())
        n_images += len(batch)

    def stat(s, k, i):
        c = counts[s][k][i]
        if c.sum() == 0:
            return {"median": None, "p99": None, "max": None}
        top = float(maxima[s][k][i])
        return {"median": min(_hist_quantile(c, 0.5), top), "p99": min(_hist_quantile(c, 0.99), top), "max": top}

    stats = {s: {k: [stat(s, k, i) for i in range(n_layers)] for k in KINDS} for s in STAGES}
    max_post = [float(v) for v in maxima["resid_post"]["patches"]]
    max_mid = [float(v) for v in maxima["resid_mid"]["patches"]]
    # The input of block i is the output of block i-1 (block 0: its own mid-stream is the first measurement).
    max_pre = [max_mid[0]] + max_post[:-1]
    emergence = find_emergence(max_pre, max_mid, max_post, emergence_factor)
    n_patch_tokens = max(n_images * lay.n_patches, 1)
    artifacts = bool(thr.bimodal and outliers.any())
    params = {"threshold": threshold, "detect_layer": detect, "emergence_factor": emergence_factor,
              "attention": attention, "batch_size": batch_size}
    return NormsResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None,
        ids=list(source.ids), n_layers=n_layers, grid=list(lay.grid), detect_layer=detect,
        threshold=thr.value if np.isfinite(thr.value) else None, threshold_method=thr.method,
        bimodal=thr.bimodal, mode_ratio=thr.mode_ratio, artifacts_found=artifacts,
        outlier_fraction=float(outliers.float().mean()) if outliers.numel() else 0.0,
        outlier_counts=outliers.sum(1).tolist(),
        outlier_maps=outliers.reshape(-1, *lay.grid).int().tolist(),
        outlier_fraction_per_layer=(above / n_patch_tokens).tolist(),
        stats=stats, max_patch_norm={"resid_mid": max_mid, "resid_post": max_post},
        median_patch_norm={s: [stats[s]["patches"][i]["median"] for i in range(n_layers)] for s in STAGES},
        histograms={s: [_trim(c) for c in counts[s]["patches"]] for s in STAGES}, hist_edges=HIST_EDGES.tolist(),
        emergence=emergence if artifacts or thr.method != "auto" else None,
        cls_attention_max=attn_max.tolist() if use_attention else None,
        cls_attention_on_outliers=(attn_share / max(n_images, 1)).tolist() if use_attention else None,
    )
