"""High-norm token detection: thresholds (fixed, per-model percentile, automatic bimodal split) and
the streaming collection of detection-layer patch norms shared by the norms and neurons studies."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import InterpError
from .source import ActivationSource, n_batches, token_norms

ThresholdSpec = Union[float, int, str]

# An automatic split counts as real artifacts only if the upper mode's typical norm is at least this
# many times the lower mode's, the split explains this share of the log-norm variance, and the upper
# mode is a minority of the tokens (artifacts are a few tokens: 2.4 % in DINOv2 ViT-g).
MIN_MODE_RATIO = 2.0
MIN_EXPLAINED = 0.6
MAX_UPPER_SHARE = 0.5


@dataclass(frozen=True)
class Threshold:
    """A resolved outlier threshold.

    Attributes:
        value: norm above which a patch token is an outlier (inf when nothing qualifies).
        method: "fixed", "percentile" or "auto".
        bimodal: whether the norm distribution has a separated high-norm mode (see :func:`bimodal_split`).
    """

    value: float
    method: str
    bimodal: bool
    split: float
    mode_ratio: float
    explained: float


def parse_threshold(spec: ThresholdSpec) -> Tuple[str, Optional[float]]:
    """'auto' -> ("auto", None); 'p98' -> ("percentile", 98); '150' or 150 -> ("fixed", 150)."""
    if isinstance(spec, (int, float)):
        return "fixed", float(spec)
    text = str(spec).strip().lower()
    if text == "auto":
        return "auto", None
    if text.startswith("p"):
        try:
            q = float(text[1:])
        except ValueError:
            q = -1.0
        if not 0 < q < 100:
            raise InterpError(f"percentile threshold {spec!r} must look like p98 (0 < q < 100)")
        return "percentile", q
    try:
        return "fixed", float(text)
    except ValueError:
        raise InterpError(f"threshold {spec!r} must be a number, pNN (e.g. p98) or auto") from None


def bimodal_split(norms: np.ndarray) -> Tuple[float, float, float, float]:
    """Otsu split of log-norms: (threshold, upper/lower mode ratio, explained variance share, upper share).

    ``norms``: 1-D array of patch-token norms. The ratio compares the medians of the two sides.
    """
    x = np.log(np.clip(np.asarray(norms, dtype=np.float64).ravel(), 1e-12, None))
    if x.size < 4 or np.ptp(x) == 0:
        return (float(np.exp(x.max())) if x.size else math.inf), 1.0, 0.0, 0.0
    hist, edges = np.histogram(x, bins=512)
    centers = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(hist)
    w1 = w0[-1] - w0
    s0 = np.cumsum(hist * centers)
    m0 = s0 / np.maximum(w0, 1)
    m1 = (s0[-1] - s0) / np.maximum(w1, 1)
    between = w0 * w1 * (m0 - m1) ** 2
    i = int(np.argmax(between[:-1]))
    cut = edges[i + 1]
    low, high = x[x < cut], x[x >= cut]
    if low.size == 0 or high.size == 0:
        return float(np.exp(cut)), 1.0, 0.0, 0.0
    explained = float(between[i] / (w0[-1] ** 2 * x.var())) if x.var() > 0 else 0.0
    ratio = float(np.exp(np.median(high) - np.median(low)))
    return float(np.exp(cut)), ratio, explained, high.size / x.size


def resolve_threshold(patch_norms: np.ndarray, spec: ThresholdSpec = "auto") -> Threshold:
    """Threshold for ``spec`` on the detection layer's patch norms (1-D array, all images)."""
    method, value = parse_threshold(spec)
    split, ratio, explained, upper = bimodal_split(patch_norms)
    bimodal = ratio >= MIN_MODE_RATIO and explained >= MIN_EXPLAINED and upper <= MAX_UPPER_SHARE
    if method == "fixed":
        thr = value
    elif method == "percentile":
        thr = float(np.percentile(patch_norms, value))
    else:
        thr = split if bimodal else math.inf
    return Threshold(value=float(thr), method=method, bimodal=bimodal, split=split, mode_ratio=ratio,
                     explained=explained)


def resid_post(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_post"


def resolve_layer(layer: Optional[int], n_layers: int) -> int:
    """Negative indices count from the end; None is the last block."""
    if layer is None:
        layer = n_layers - 1
    if layer < 0:
        layer += n_layers
    if not 0 <= layer < n_layers:
        raise InterpError(f"layer {layer} is out of range for a model with {n_layers} blocks")
    return layer


def detection_norms(source: ActivationSource, layer: int, batch_size: int = 16,
                    progress: bool = True) -> torch.Tensor:
    """Patch-token norms of ``blocks.{layer}.hook_resid_post`` for every image: [N, n_patches] float32."""
    hook = resid_post(layer)
    source.require([hook])
    patches = source.layout.patch_slice
    out: List[torch.Tensor] = []
    for batch in tqdm(source.batches([hook], batch_size, reduce={hook: token_norms}), disable=not progress,
                      total=n_batches(source, batch_size), desc=f"norms @ block {layer}", unit="batch", leave=False):
        out.append(batch.acts[hook][:, patches])
    return torch.cat(out) if out else torch.zeros(0, source.layout.n_patches)
