"""High-norm token detection, the contract every study built on high-norm tokens follows.

* thresholds (fixed, per-model percentile, automatic two-mode split of the log norms,
  :mod:`interp.detection.norm_split`) and their verdict on artifacts (:mod:`interp.detection.thresholds`);
* :class:`DetectionSpec` says what to detect: a threshold (a norm, ``"pNN"`` or ``"auto"``), a block, a preset
  (:mod:`interp.detection.presets`);
* :class:`Detection` is that spec resolved once on a source: the detection block's patch norms streamed in one
  pass (:func:`detect`), the threshold, the preset it came from; studies take either, so one detection pass
  serves a whole battery (norms, neurons, ablation, test-time register, the SAE's artifact features);
* :func:`detection_header` is the one result header (``detect_layer``, ``threshold`` = the resolved value or
  None, ``threshold_method``, ``artifacts_found``, ``warning``, ``preset``): the same meaning in every result;
* :class:`RunOptions`: batch size and progress bars of a pass.

>>> det = detect(source, threshold="auto", layer=-1, progress=False)     # one pass over the images
>>> det.outliers.shape, det.artifacts_found                               # [N, P] bool, bool
(torch.Size([4, 196]), True)
>>> from interp.studies.artifacts.norms import norms_study
>>> from interp.studies.artifacts.neurons import neurons_study
>>> norms = norms_study(source, detection=det, progress=False)            # no second detection pass
>>> neurons = neurons_study(source, detection=det, top_k=4, progress=False)
>>> spec = DetectionSpec(preset="darcet")                 # threshold 150 at the last block
>>> found = detect_spec(source, spec, RunOptions(progress=False))   # one pass: a Detection
>>> result = norms_study(source, detection=found, progress=False)
>>> result.threshold, result.threshold_method, result.preset, result.params["threshold"]
(150.0, 'fixed', 'darcet', 150.0)
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from .._progress import tqdm

from ..errors import InterpError, InterpWarning
from ..hooks.names import resolve_block
from ..runtime.forward import Baseline
from ..runtime.passes import baseline_pass
from ..runtime.source import ActivationSource, n_batches, token_norms
from .formation import MIN_FORMED_GAIN, formed_mask
from .presets import check_preset_model, resolve_preset
from .spec import DetectionSpec
from .survey import Survey, formed_verdict, judge_block, survey_of
from .thresholds import Threshold, ThresholdSpec, detect_norms, parse_threshold, percentile_value


def block_norms(source: ActivationSource, layers: Sequence[int], with_input: bool, batch_size: int = 16,
                progress: bool = True) -> Tuple[Dict[int, torch.Tensor], Optional[torch.Tensor]]:
    """One pass: the patch-token norms of each block of ``layers``' output ({layer: [N, P_layer] float32}) and,
    with ``with_input`` and where the source has it, of the input of block 0 (``blocks.0.hook_resid_pre``,
    [N, P_0]; None otherwise)."""
    names = source.blocks
    hooks = {layer: names.resid_post(layer) for layer in layers}
    source.require(list(hooks.values()))
    entry = names.resid_pre(0)
    read = list(hooks.values()) + ([entry] if with_input and source.has(entry) else [])
    out: Dict[str, List[torch.Tensor]] = {h: [] for h in read}
    label = source.blocks.label(layers[0]) if len(layers) == 1 else f"{len(layers)} blocks"
    for batch in tqdm(source.batches(read, batch_size, reduce={h: token_norms for h in read}), disable=not progress,
                      total=n_batches(source, batch_size), desc=f"norms @ {label}", unit="batch", leave=False):
        for h in read:
            out[h].append(batch.acts[h][:, batch.layout_of(h).patch_slice])

    def cat(h: str) -> torch.Tensor:
        return torch.cat(out[h]) if out[h] else torch.zeros(0, source.layout_of(h).n_patches)

    return {layer: cat(h) for layer, h in hooks.items()}, (cat(entry) if entry in out else None)


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
        input_ratio: each token's norm ratio at the input of block 0 on this block's grid ([N, P] float64,
            :func:`~interp.detection.formation.input_ratios`), or None where the source has no input hook (then
            every token above the threshold counts as formed by the blocks).
        survey: the verdict at every block when the block was chosen (:mod:`interp.detection.survey`), or None
            when it was given.
        min_gain: the formed-inside rule's gain (:data:`~interp.detection.formation.MIN_FORMED_GAIN`).
    """

    layer: int
    spec: ThresholdSpec
    threshold: Threshold
    norms: torch.Tensor
    ids: Tuple[str, ...]
    fingerprint: str
    preset: Optional[str] = None
    input_ratio: Optional[torch.Tensor] = field(default=None, compare=False)
    survey: Optional[Survey] = None
    min_gain: float = MIN_FORMED_GAIN

    def __repr__(self) -> str:
        """A short summary; the norms and the ids (kilobytes) are in ``.norms`` and ``.ids``."""
        n, p = self.norms.shape
        return (f"Detection(layer={self.layer}, threshold={self.threshold.value:.4g} ({self.method}), images={n}, "
                f"patches={p}, outliers={int(self.outliers.sum())}, artifacts_found={self.artifacts_found}, "
                f"preset={self.preset!r})")

    @property
    def method(self) -> str:
        return self.threshold.method

    @cached_property
    def above(self) -> torch.Tensor:
        """Bool[N, P]: patch tokens above the threshold (their image's own cut under "auto")."""
        return self.threshold.mask(self.norms)

    @cached_property
    def formed(self) -> torch.Tensor:
        """Bool[N, P]: tokens the blocks raised (:func:`~interp.detection.formation.formed_mask`); all of them
        without an input to compare with."""
        if self.input_ratio is None:
            return torch.ones(self.norms.shape, dtype=torch.bool)
        return formed_mask(self.norms, self.input_ratio, self.min_gain)

    @property
    def outliers(self) -> torch.Tensor:
        """Bool[N, P]: the artifacts' tokens: above the threshold and formed by the blocks."""
        return self.above & self.formed

    @property
    def from_input(self) -> torch.Tensor:
        """Bool[N, P]: tokens above the threshold that were already high-norm at the input (not artifacts)."""
        return self.above & ~self.formed

    @property
    def artifacts_found(self) -> bool:
        """The threshold's verdict (see :class:`Threshold`: fixed values by the share above them, "auto" and
        percentiles by the two-mode test) on tokens formed by the blocks: :func:`formed_verdict`."""
        return formed_verdict(self.threshold, int(self.outliers.sum()), int(self.above.sum()))

    @property
    def reason(self) -> str:
        """The verdict's reason: the threshold's, and what came from the input when something did."""
        note = self.input_note()
        return self.threshold.reason + (f"; {note}" if note else "")

    def describe(self) -> str:
        """The threshold's line (:meth:`Threshold.describe`) with this verdict: tokens carried from the input
        turn "artifacts found" into "no artifacts", and are named."""
        text, note = self.threshold.describe(), self.input_note()
        if self.threshold.artifacts_found and not self.artifacts_found:
            text = "no artifacts (not formed by the blocks): " + text.split(": ", 1)[1]
        return text + (f"; {note}" if note else "")

    def input_note(self) -> Optional[str]:
        """'k of the n tokens above the threshold are high-norm from the input (not formed by the blocks) ...',
        or None when none is."""
        carried, above = int(self.from_input.sum()), int(self.above.sum())
        if not carried:
            return None
        return (f"{carried} of the {above} tokens above the threshold are high-norm from the input (not formed by "
                f"the blocks: their norm over their image's 10th percentile is less than {self.min_gain:g}x what "
                "it was at the input of block 0)")

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
        if layer is not None and resolve_block(layer, source.n_layers) != self.layer:
            raise InterpError(f"detect_layer={layer} disagrees with the detection's block {self.layer}; "
                              "pass one of them")
        if threshold is not None and threshold != self.spec:
            raise InterpError(f"threshold={threshold!r} disagrees with the detection's {self.spec!r}; "
                              "pass one of them")
        return self


def detect(source: ActivationSource, threshold: ThresholdSpec = "auto", layer: Optional[int] = None,
           batch_size: Optional[int] = None, progress: bool = True) -> Detection:
    """One pass over ``source``: the detection block's patch norms, the resolved threshold and the input's norm
    ratios (:mod:`interp.detection.formation`).

    Args:
        threshold: a norm, ``"pNN"`` or ``"auto"`` (see :func:`resolve_threshold`).
        layer: detection block (negative counts from the end). None: every block the source has is judged in the
            same pass and the block is chosen where the artifacts are (:mod:`interp.detection.survey`: the last
            block when none has any, else the last block with artifacts of the stage where they are strongest).
    """
    n = source.n_layers
    if layer is None:
        layers = [i for i in range(n) if source.has(source.blocks.resid_post(i))] or [n - 1]
    else:
        layers = [resolve_block(layer, n)]
    norms, entry = block_norms(source, layers, True, batch_size or source.batch_size, progress)
    return _detection(source, threshold, layers, norms, entry, layer is None)


def _detection(source: ActivationSource, threshold: ThresholdSpec, layers: Sequence[int],
               norms: Dict[int, torch.Tensor], entry: Optional[torch.Tensor], survey: bool) -> Detection:
    """The Detection from the patch norms of ``layers`` ({layer: [N, P]}) and of the input ([N, P_0] or None):
    each block judged (:func:`~interp.detection.survey.judge_block`), the block chosen when ``survey``."""
    judged = {i: judge_block(source, i, norms[i], threshold, entry) for i in layers}
    chosen = survey_of([judged[i][2] for i in layers], source.blocks.staged) if survey else None
    block = layers[0] if chosen is None else chosen.chosen
    thr, ratio, _ = judged[block]
    return Detection(layer=block, spec=threshold, threshold=thr, norms=norms[block], ids=tuple(source.ids),
                     fingerprint=source.fingerprint, input_ratio=ratio, survey=chosen)


def no_artifacts_warning(found: Detection, study: str) -> str:
    """The one-line warning a study built on outliers carries when the model shows no artifacts."""
    threshold = found.threshold
    head = f"no artifacts: at block {found.layer}, {found.reason}; "
    if threshold.artifacts_found:  # the threshold found tokens, but the input made them
        return head + (f"whatever the {study} study counts is tokens carried from the input, not register "
                       "artifacts")
    if not math.isfinite(threshold.value):
        return head + (f"no token is an artifact under the automatic split; whatever the {study} study counts "
                       "is ordinary tokens")
    return head + (f"the {study} study ran under the {threshold.method} threshold {threshold.value:.4g}, so its "
                   "'outliers' are ordinary high-norm tokens, not register artifacts")


def artifact_status(found: Detection, study: str, warn: bool = True) -> Tuple[bool, Optional[str]]:
    """``(artifacts_found, warning)`` for a study's JSON; the warning is also raised with ``warnings.warn``
    (the CLI shows it as one line) when ``warn``. It says why there are no artifacts, or, when there are,
    the threshold's own caveat (it lies inside the bulk) and the tokens carried from the input; None when there
    is nothing to say."""
    if found.artifacts_found:
        notes = [n for n in (found.threshold.warning, found.input_note()) if n]
        text = f"block {found.layer}: {'; '.join(notes)}" if notes else None
    else:
        text = no_artifacts_warning(found, study)
    if warn and text is not None:
        warnings.warn(text, InterpWarning, stacklevel=3)
    return found.artifacts_found, text


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


DetectionLike = Union[Detection, DetectionSpec, None]


def detect_spec(source, spec: DetectionSpec, options: Optional[RunOptions] = None) -> Detection:
    """One pass over ``source``: the :class:`Detection` of ``spec`` resolved (it remembers the preset)."""
    o = options or RunOptions()
    spec = spec.resolved()
    check_preset_model(spec.preset, getattr(source, "model", None))
    found = detect(source, spec.threshold, spec.detect_layer, o.batch_for(source), o.progress)
    return replace(found, preset=spec.preset)


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
        spec = DetectionSpec(threshold=threshold, detect_layer=detect_layer, preset=preset)
    else:
        raise InterpError(f"detection= takes a Detection or a DetectionSpec, not {type(detection).__name__}")
    return detect_spec(source, spec, options)


def spec_of(detection: DetectionLike, *, threshold: Optional[ThresholdSpec] = None,
            detect_layer: Optional[int] = None, preset: Optional[str] = None) -> DetectionSpec:
    """The resolved :class:`DetectionSpec` of a study that has no Detection yet (``detection`` a spec or None)."""
    if isinstance(detection, DetectionSpec):
        if threshold is not None or detect_layer is not None or preset is not None:
            raise InterpError("give the threshold, detection layer and preset in the DetectionSpec or as "
                              "arguments, not both")
        return detection.resolved()
    return DetectionSpec(threshold=threshold, detect_layer=detect_layer, preset=preset).resolved()


def detect_with_baseline(source, spec: DetectionSpec, classifier=None, batch_size: Optional[int] = None,
                         progress: bool = True) -> Tuple[Detection, Baseline]:
    """The report's and ``reassess``'s one unedited pass over a live ``source``: the causal studies' baseline
    (:func:`~interp.runtime.passes.baseline_pass`, with ``classifier``) at the detection block, and the
    :class:`Detection` of ``spec`` (resolved) from the same forward, made as :func:`detect` makes it (every
    block judged when the spec names none, the input's norms compared)."""
    spec = spec.resolved()
    check_preset_model(spec.preset, getattr(source, "model", None))
    n, names = source.n_layers, source.blocks
    layers = list(range(n)) if spec.detect_layer is None else [resolve_block(spec.detect_layer, n)]
    hooks = [names.resid_post(i) for i in layers] + [names.resid_pre(0)]
    base = baseline_pass(source, layers[-1], batch_size, progress, classifier, norm_hooks=hooks)
    norms = {i: base.norms[names.resid_post(i)][:, source.layout_of(names.resid_post(i)).patch_slice]
             for i in layers}
    entry = base.norms[hooks[-1]][:, source.layout_of(hooks[-1]).patch_slice]
    found = _detection(source, spec.threshold, layers, norms, entry, spec.detect_layer is None)
    return replace(found, preset=spec.preset), replace(base, layer=found.layer, patch_norms=norms[found.layer])


def detection_from_norms(source, spec: DetectionSpec, norms) -> Detection:
    """The Detection of ``spec`` (resolved) from detection-layer patch norms [N, P] a study's own baseline
    pass already computed on ``source`` (so it needs no detection pass of its own)."""
    check_preset_model(spec.preset, getattr(source, "model", None))
    return Detection(layer=resolve_block(spec.detect_layer, source.n_layers), spec=spec.threshold,
                     threshold=detect_norms(norms, spec.threshold).threshold, norms=norms,
                     ids=tuple(source.ids), fingerprint=source.fingerprint, preset=spec.preset)


def detection_header(found: Detection, study: str, warn: bool = True) -> Dict[str, Any]:
    """The result fields every outlier study carries, with one meaning:

    ``detect_layer`` (resolved block), ``threshold`` (the resolved norm threshold, None when "auto" finds no
    separated high-norm mode), ``threshold_method`` ("fixed", "percentile", "auto"), ``artifacts_found``,
    ``warning`` (why the outliers are not register artifacts; also raised with ``warnings.warn`` when
    ``warn``), ``preset`` (the canonical preset name or None)."""
    artifacts, warning = artifact_status(found, study, warn=warn)
    value = found.threshold.value
    return {"detect_layer": found.layer, "threshold": value if math.isfinite(value) else None,
            "threshold_method": found.method, "artifacts_found": artifacts, "warning": warning,
            "preset": found.preset, "high_norm_from_input": int(found.from_input.sum()),
            "artifact_blocks": None if found.survey is None else found.survey.describe()}


def detection_params(found: Detection) -> Dict[str, Any]:
    """The detection part of a result's ``params``: the threshold as asked for (one form), block and preset."""
    return {"threshold": threshold_param(found.spec), "detect_layer": found.layer, "preset": found.preset}
