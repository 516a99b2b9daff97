"""The detection contract every study built on high-norm tokens follows, and the run options they share.

* :class:`DetectionSpec` says what to detect: a threshold (a norm, ``"pNN"`` or ``"auto"``), a block, a preset.
* :class:`~interp.studies.core.outliers.Detection` is that spec resolved once on a source (norms, threshold, the
  preset it came from); studies take either, so one detection pass serves a whole battery.
* :func:`detection_header` is the one result header (``detect_layer``, ``threshold`` = the resolved value or
  None, ``threshold_method``, ``artifacts_found``, ``warning``, ``preset``): the same meaning in every result.
* :class:`RunOptions`: batch size and progress bars of a pass.

>>> from interp.studies.artifacts.norms import norms_study
>>> spec = DetectionSpec(preset="darcet")                 # threshold 150 at the last block
>>> found = spec.detect(source, RunOptions(progress=False))   # one pass: a Detection
>>> result = norms_study(source, detection=found, progress=False)   # no second detection pass
>>> result.threshold, result.threshold_method, result.preset, result.params["threshold"]
(150.0, 'fixed', 'darcet', 150.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Union

from ...errors import InterpError
from .outliers import Detection, artifact_status, detect, resolve_layer
from .thresholds import ThresholdSpec, detect_norms, parse_threshold
from .presets import check_preset_model, resolve_preset


@dataclass(frozen=True)
class RunOptions:
    """How a pass runs (never what it computes): what :meth:`DetectionSpec.detect` and the studies' own
    detection passes read.

    Attributes:
        batch_size: images per forward (None: the source's).
        progress: show progress bars.

    No device and no seed here, on purpose: a study runs where its source's model is (move the model before,
    ``interp.load(..., device=...)`` or ``model.to(...)``; no study moves a model it was given), and each study
    that draws at random takes its own ``seed=`` (what it seeds differs: ablation controls, image subsets,
    probe splits), recorded in its result.
    """

    batch_size: Optional[int] = None
    progress: bool = True

    def batch_for(self, source) -> int:
        return int(self.batch_size or source.batch_size)


def threshold_param(spec: Optional[ThresholdSpec]) -> Union[float, str, None]:
    """The one JSON form of a threshold as asked for: a float for a fixed norm, ``"pNN"``/``"auto"`` else."""
    if spec is None:
        return None
    method, value = parse_threshold(spec)
    if method == "fixed":
        return float(value)
    return "auto" if method == "auto" else f"p{value:g}"


@dataclass(frozen=True)
class DetectionSpec:
    """What counts as a high-norm token: ``threshold`` at block ``layer`` (negative: from the end), filled in by
    ``preset`` (published settings) where not given; defaults "auto" at the last block.

    Attributes:
        threshold: a norm, ``"pNN"`` (per-model percentile) or ``"auto"`` (bimodal split); None: preset's/auto.
        layer: detection block (its ``hook_resid_post``); None: the preset's, else the last block.
        preset: a name of :mod:`interp.studies.core.presets`; explicit values win over it.
    """

    threshold: Optional[ThresholdSpec] = None
    layer: Optional[int] = None
    preset: Optional[str] = None

    def resolved(self) -> "DetectionSpec":
        """This spec with the preset applied (threshold and layer filled in, the preset's canonical name)."""
        r = resolve_preset(self.preset, threshold=self.threshold, detect_layer=self.layer)
        threshold = r.get("threshold", "auto")
        parse_threshold(threshold)  # a bad threshold is reported before any pass
        return DetectionSpec(threshold=threshold, layer=r.get("detect_layer"), preset=r["preset"])

    def detect(self, source, options: Optional[RunOptions] = None) -> Detection:
        """One pass over ``source``: the resolved :class:`Detection` (it remembers the preset)."""
        o = options or RunOptions()
        spec = self.resolved()
        check_preset_model(spec.preset, getattr(source, "model", None))
        found = detect(source, spec.threshold, spec.layer, o.batch_for(source), o.progress)
        return replace(found, preset=spec.preset)


DetectionLike = Union[Detection, DetectionSpec, None]


def as_detection(source, detection: DetectionLike = None, *, threshold: Optional[ThresholdSpec] = None,
                 detect_layer: Optional[int] = None, preset: Optional[str] = None,
                 options: Optional[RunOptions] = None) -> Detection:
    """The :class:`Detection` a study works with.

    ``detection`` may be a Detection made on this source (checked: same images and weights; the loose
    arguments, when given, must agree with it), a :class:`DetectionSpec`, or None (the loose arguments make
    the spec). A spec given together with loose arguments is refused: pass one of them.
    """
    if isinstance(detection, Detection):
        if preset is not None and resolve_preset(preset)["preset"] != detection.preset:
            raise InterpError(f"preset={preset!r} disagrees with the detection's ({detection.preset!r}); "
                              "make the detection with DetectionSpec(preset=...) or pass one of them")
        return detection.check(source, detect_layer, threshold)
    if isinstance(detection, DetectionSpec):
        if threshold is not None or detect_layer is not None or preset is not None:
            raise InterpError("give the threshold, detection layer and preset in the DetectionSpec or as "
                              "arguments, not both")
        spec = detection
    elif detection is None:
        spec = DetectionSpec(threshold, detect_layer, preset)
    else:
        raise InterpError(f"detection= takes a Detection or a DetectionSpec, not {type(detection).__name__}")
    return spec.detect(source, options)


def spec_of(detection: DetectionLike, *, threshold: Optional[ThresholdSpec] = None,
            detect_layer: Optional[int] = None, preset: Optional[str] = None) -> DetectionSpec:
    """The resolved :class:`DetectionSpec` of a study that has no Detection yet (``detection`` a spec or None)."""
    if isinstance(detection, DetectionSpec):
        if threshold is not None or detect_layer is not None or preset is not None:
            raise InterpError("give the threshold, detection layer and preset in the DetectionSpec or as "
                              "arguments, not both")
        return detection.resolved()
    return DetectionSpec(threshold, detect_layer, preset).resolved()


def detection_from_norms(source, spec: DetectionSpec, norms) -> Detection:
    """The Detection of ``spec`` (resolved) from detection-layer patch norms [N, P] a study's own baseline
    pass already computed on ``source`` (so it needs no detection pass of its own)."""
    check_preset_model(spec.preset, getattr(source, "model", None))
    return Detection(layer=resolve_layer(spec.layer, source.n_layers), spec=spec.threshold,
                     threshold=detect_norms(norms, spec.threshold).threshold, norms=norms,
                     ids=tuple(source.ids), fingerprint=source.fingerprint, preset=spec.preset)


def detection_header(found: Detection, study: str, warn: bool = True) -> Dict[str, Any]:
    """The result fields every outlier study carries, with one meaning:

    ``detect_layer`` (resolved block), ``threshold`` (the resolved norm threshold, None when "auto" finds no
    separated high-norm mode), ``threshold_method`` ("fixed", "percentile", "auto"), ``artifacts_found``,
    ``warning`` (why the outliers are not register artifacts; also raised with ``warnings.warn`` when
    ``warn``), ``preset`` (the canonical preset name or None)."""
    artifacts, warning = artifact_status(found.layer, found.threshold, found.artifacts_found, study, warn=warn)
    value = found.threshold.value
    return {"detect_layer": found.layer, "threshold": value if math.isfinite(value) else None,
            "threshold_method": found.method, "artifacts_found": artifacts, "warning": warning,
            "preset": found.preset}


def detection_params(found: Detection) -> Dict[str, Any]:
    """The detection part of a result's ``params``: the threshold as asked for (one form), block and preset."""
    return {"threshold": threshold_param(found.spec), "detect_layer": found.layer, "preset": found.preset}
