"""High-norm token detection: thresholds (fixed, per-model percentile, automatic bimodal split), the
streaming collection of detection-layer patch norms, and :class:`Detection`, their result computed once per
source and handed to every study that needs it (norms, neurons, ablation, test-time register).

>>> det = detect(source, threshold="auto", layer=-1, progress=False)     # one pass over the images
>>> det.outliers.shape, det.artifacts_found                               # [N, P] bool, bool
(torch.Size([4, 196]), True)
>>> from interp.studies.neurons import neurons_study
>>> from interp.studies.norms import norms_study
>>> norms = norms_study(source, detection=det, progress=False)            # no second detection pass
>>> neurons = neurons_study(source, detection=det, top_k=4, progress=False)
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import InterpError
from ..hooks.names import resid_post
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
    out: List[torch.Tensor] = []
    for batch in tqdm(source.batches([hook], batch_size, reduce={hook: token_norms}), disable=not progress,
                      total=n_batches(source, batch_size), desc=f"norms @ block {layer}", unit="batch", leave=False):
        out.append(batch.acts[hook][:, batch.layout.patch_slice])
    return torch.cat(out) if out else torch.zeros(0, source.layout.n_patches)


@dataclass(frozen=True)
class Detection:
    """High-norm tokens of one source at one block, found once and shared by the studies.

    Attributes:
        layer: the detection block (its ``hook_resid_post`` decides outliers).
        spec: the threshold as asked for (a norm, ``"pNN"`` or ``"auto"``).
        threshold: the resolved :class:`Threshold` (value inf when "auto" finds no separated mode).
        norms: per-image patch-token norms at ``layer``: Tensor[N, P] float32.
        ids: the source's image ids, in order (checked when a study is handed this detection).
        fingerprint: weights fingerprint of the source's model.
        preset: the published settings the threshold and layer came from (see ``DetectionSpec``), or None.
    """

    layer: int
    spec: ThresholdSpec
    threshold: Threshold
    norms: torch.Tensor
    ids: Tuple[str, ...]
    fingerprint: str
    preset: Optional[str] = None

    @property
    def method(self) -> str:
        return self.threshold.method

    @property
    def outliers(self) -> torch.Tensor:
        """Bool[N, P]: patch tokens above the threshold."""
        return self.norms > self.threshold.value

    @property
    def artifacts_found(self) -> bool:
        """A separated high-norm mode exists and some patch token is in it."""
        return bool(self.threshold.bimodal and self.outliers.any())

    def counting_threshold(self) -> float:
        """The threshold the causal studies count outliers with: the resolved value, or the 99th percentile of
        these norms when "auto" finds no bimodal split (so counts stay comparable)."""
        if math.isfinite(self.threshold.value):
            return self.threshold.value
        return resolve_threshold(self.norms.numpy().ravel(), "p99").value

    def check(self, source: ActivationSource, layer: Optional[int] = None,
              threshold: Optional[ThresholdSpec] = None) -> "Detection":
        """This detection, after checking it was made on ``source`` (same images and weights) and, when given,
        at ``layer`` (resolved) with ``threshold``; raises InterpError naming the mismatch."""
        if tuple(source.ids) != self.ids or source.fingerprint != self.fingerprint:
            raise InterpError("this detection was computed on other images or weights than the source; "
                              "compute it with detect(source, ...) on the same source")
        if layer is not None and resolve_layer(layer, source.n_layers) != self.layer:
            raise InterpError(f"detect_layer={layer} disagrees with the detection's block {self.layer}; "
                              "pass one of them")
        if threshold is not None and threshold != self.spec:
            raise InterpError(f"threshold={threshold!r} disagrees with the detection's {self.spec!r}; "
                              "pass one of them")
        return self


def detect(source: ActivationSource, threshold: ThresholdSpec = "auto", layer: Optional[int] = None,
           batch_size: Optional[int] = None, progress: bool = True) -> Detection:
    """One pass over ``source``: the detection block's patch norms and the resolved threshold.

    Args:
        threshold: a norm, ``"pNN"`` or ``"auto"`` (see :func:`resolve_threshold`).
        layer: detection block (default: the last; negative counts from the end).
    """
    block = resolve_layer(layer, source.n_layers)
    norms = detection_norms(source, block, batch_size or source.batch_size, progress)  # [N, P]
    return Detection(layer=block, spec=threshold, threshold=resolve_threshold(norms.numpy().ravel(), threshold),
                     norms=norms, ids=tuple(source.ids), fingerprint=source.fingerprint)


def detection_for(source: ActivationSource, detection: Optional[Detection], threshold: Optional[ThresholdSpec],
                  layer: Optional[int], batch_size: Optional[int], progress: bool) -> Detection:
    """The detection a study works with: ``detection`` checked against the source and the study's own
    arguments, or a fresh :func:`detect` (threshold default "auto") when none is given."""
    if detection is not None:
        return detection.check(source, layer, threshold)
    return detect(source, "auto" if threshold is None else threshold, layer, batch_size, progress)


def no_artifacts_warning(layer: int, threshold: Threshold, study: str) -> str:
    """The one-line warning a study built on outliers carries when the model shows no artifacts."""
    head = (f"no artifacts: the patch-token norms at block {layer} have no separated high-norm mode (automatic "
            f"split rejected, mode ratio {threshold.mode_ratio:.2f}); ")
    if not math.isfinite(threshold.value):
        return head + (f"no token is an artifact under the automatic split; whatever the {study} study counts "
                       "is ordinary tokens")
    return head + (f"the {study} study ran under the {threshold.method} threshold {threshold.value:.4g}, so its "
                   "'outliers' are ordinary high-norm tokens, not register artifacts")


def artifact_status(layer: int, threshold: Threshold, artifacts_found: bool, study: str,
                    warn: bool = True) -> Tuple[bool, Optional[str]]:
    """``(artifacts_found, warning)`` for a study's JSON; the warning is also raised with ``warnings.warn``
    (the CLI shows it as one line) when ``warn`` and no artifacts were found."""
    if artifacts_found:
        return True, None
    text = no_artifacts_warning(layer, threshold, study)
    if warn:
        warnings.warn(text, stacklevel=3)
    return False, text
