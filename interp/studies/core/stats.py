"""Statistics the study themes share: one IoU (Jaccard index) for masks and for boxes, one empty-set rule; the
percentile bootstrap interval of a hit rate (PiB, CorLoc); the share of CLS attention on the artifact patches
(:func:`attention_on_artifacts`: test-time registers, the reassessment, the repairs).

IoU = |A & B| / |A | B|. When both sets are empty (no cell in either mask; two boxes of zero area) the union
is empty and the ratio means nothing: these functions return None then, never 0 or 1. Callers leave such
cases out of their means and report how many they scored (relocation onto an empty target is refused up
front; LOST's CorLoc counts a None IoU as no hit).

>>> a = torch.tensor([[True, True], [False, False]])
>>> iou(a, torch.tensor([[True, False], [False, False]])), iou(a, ~a)
(0.5, 0.0)
>>> iou(torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.bool)) is None
True
>>> box_iou([0, 0, 10, 10], [5, 0, 15, 10])           # [x0, y0, x1, y1], pixel-edge coordinates
0.3333333333333333
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...errors import InterpError


def iou(a, b) -> Optional[float]:
    """IoU of two boolean masks of one shape (torch or numpy); None when both are empty."""
    a, b = torch.as_tensor(np.asarray(a) if not torch.is_tensor(a) else a), \
        torch.as_tensor(np.asarray(b) if not torch.is_tensor(b) else b)
    if a.shape != b.shape:
        raise InterpError(f"masks of shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    a, b = a.bool(), b.bool()
    union = int((a | b).sum())
    return None if union == 0 else int((a & b).sum()) / union


def box_iou(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """IoU of two ``[x0, y0, x1, y1]`` boxes (pixel-edge coordinates); None when both have zero area."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])  # noqa: E731
    union = area(a) + area(b) - inter
    return None if union <= 0 else inter / union


def bootstrap_ci(hits: np.ndarray, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> Tuple[float, float]:
    """Percentile bootstrap interval of the mean of 0/1 ``hits`` (images resampled with replacement).

    Returns (nan, nan) for no images."""
    hits = np.asarray(hits, dtype=np.float64)
    if hits.size == 0:
        return float("nan"), float("nan")
    if not 0 < level < 1:
        raise InterpError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    means = hits[rng.integers(0, hits.size, size=(int(n_boot), hits.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))


def attention_on_artifacts(attention: torch.Tensor, outliers: torch.Tensor) -> Tuple[List[float], List[float]]:
    """Attention-map cleanliness: per image that has outliers, the share of its CLS->patch attention
    ``attention`` [b, P] (head mean; renormalised over the P patches, so attention on CLS or register tokens
    is left out) that lands on the patches of ``outliers`` Bool[b, P], and the share of the patches they are
    (the same share under a uniform map). Returns (attention shares, patch shares), one entry per image with at
    least one outlier."""
    attention = attention.float()
    keep = outliers.any(-1)
    on = (attention * outliers).sum(-1) / attention.sum(-1).clamp_min(1e-12)
    return on[keep].tolist(), outliers.float().mean(-1)[keep].tolist()
