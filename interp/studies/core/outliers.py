"""High-norm token detection: thresholds (fixed, per-model percentile, automatic two-mode split of the log
norms, :mod:`interp.studies.core.norm_split`) and their verdict on artifacts (:func:`resolve_threshold`), the
streaming collection of detection-layer patch norms, and :class:`Detection`, their result computed once per
source and handed to every study that needs it (norms, neurons, ablation, test-time register).

>>> det = detect(source, threshold="auto", layer=-1, progress=False)     # one pass over the images
>>> det.outliers.shape, det.artifacts_found                               # [N, P] bool, bool
(torch.Size([4, 196]), True)
>>> from interp.studies.artifacts.neurons import neurons_study
>>> from interp.studies.artifacts.norms import norms_study
>>> norms = norms_study(source, detection=det, progress=False)            # no second detection pass
>>> neurons = neurons_study(source, detection=det, top_k=4, progress=False)
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from ..._progress import tqdm

from ...errors import InterpError
from ...runtime.source import ActivationSource, n_batches, token_norms
from .thresholds import Threshold, ThresholdSpec, detect_norms, percentile_value


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
    """Patch-token norms of block ``layer``'s output (``hook_resid_post``) for every image: [N, n_patches] float32
    (the patches of that block's grid)."""
    hook = source.blocks.resid_post(layer)
    source.require([hook])
    out: List[torch.Tensor] = []
    desc = f"norms @ {source.blocks.label(layer)}"
    for batch in tqdm(source.batches([hook], batch_size, reduce={hook: token_norms}), disable=not progress,
                      total=n_batches(source, batch_size), desc=desc, unit="batch", leave=False):
        out.append(batch.acts[hook][:, batch.layout_of(hook).patch_slice])
    return torch.cat(out) if out else torch.zeros(0, source.layout_of(hook).n_patches)


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
        """Bool[N, P]: patch tokens above the threshold (their image's own cut under "auto")."""
        return self.threshold.mask(self.norms)

    @property
    def artifacts_found(self) -> bool:
        """The threshold's verdict (see :class:`Threshold`): fixed values by the share above them, "auto" and
        percentiles by the two-mode test."""
        return self.threshold.artifacts_found

    def counting_threshold(self) -> float:
        """The threshold the causal studies count outliers with: the resolved value, or the 99th percentile of
        these norms when "auto" finds no bimodal split (so counts stay comparable)."""
        if math.isfinite(self.threshold.value):
            return self.threshold.value
        return percentile_value(self.norms.numpy().ravel(), 99)  # the value only: no split to refit

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
    return Detection(layer=block, spec=threshold, threshold=detect_norms(norms, threshold).threshold,
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
    head = f"no artifacts: at block {layer}, {threshold.reason}; "
    if not math.isfinite(threshold.value):
        return head + (f"no token is an artifact under the automatic split; whatever the {study} study counts "
                       "is ordinary tokens")
    return head + (f"the {study} study ran under the {threshold.method} threshold {threshold.value:.4g}, so its "
                   "'outliers' are ordinary high-norm tokens, not register artifacts")


def artifact_status(layer: int, threshold: Threshold, artifacts_found: bool, study: str,
                    warn: bool = True) -> Tuple[bool, Optional[str]]:
    """``(artifacts_found, warning)`` for a study's JSON; the warning is also raised with ``warnings.warn``
    (the CLI shows it as one line) when ``warn``. It says why there are no artifacts, or, when there are,
    the threshold's own caveat (it lies inside the bulk); None when there is nothing to say."""
    if artifacts_found:
        text = None if threshold.warning is None else f"block {layer}: {threshold.warning}"
    else:
        text = no_artifacts_warning(layer, threshold, study)
    if warn and text is not None:
        warnings.warn(text, stacklevel=3)
    return artifacts_found, text
