"""High-norm token detection, the contract every study built on high-norm tokens follows.

* thresholds (fixed, per-model percentile, automatic two-mode split of the log norms,
  :mod:`interp.detection.norm_split`) and their verdict on artifacts (:mod:`interp.detection.thresholds`);
* :class:`~interp.detection.spec.DetectionSpec` says what to detect: a threshold (a norm, ``"pNN"`` or
  ``"auto"``), a block, a preset (:mod:`interp.detection.presets`);
* :func:`detect`, the one way to a detection: a spec resolved on a source in one pass (or read from norms a pass
  already made), or a :class:`Detection` already made checked against the source;
* :class:`Detection` is that spec resolved once on a source: the detection block's patch norms, the threshold,
  the preset it came from. Every study that counts high-norm tokens takes ``detection=`` a Detection or a
  DetectionSpec, so one detection pass serves a whole battery (norms, neurons, ablation, test-time register, the
  SAE's artifact features);
* :func:`detection_header` is the one result header (``detect_layer``, ``threshold`` = the resolved value or
  None, ``threshold_method``, ``artifacts_found``, ``warning``, ``preset``): the same meaning in every result;
* :class:`RunOptions`: batch size and progress bars of a pass.

>>> found = detect(source, DetectionSpec(threshold="auto", detect_layer=-1), RunOptions(progress=False))
>>> found.outliers.shape, found.artifacts_found                           # [N, P] bool, bool
(torch.Size([4, 196]), True)
>>> from interp.studies.artifacts.norms import norms_study
>>> from interp.studies.artifacts.neurons import neurons_study
>>> norms = norms_study(source, detection=found, progress=False)          # no second detection pass
>>> neurons = neurons_study(source, detection=found, top_k=4, progress=False)
>>> darcet = detect(source, DetectionSpec(preset="darcet"), RunOptions(progress=False))  # 150 at the last block
>>> result = norms_study(source, detection=darcet, progress=False)
>>> result.threshold, result.threshold_method, result.preset, result.params["threshold"]
(150.0, 'fixed', 'darcet', 150.0)
>>> norms_study(source, detection=DetectionSpec(threshold="p98"), progress=False).threshold_method  # its own pass
'percentile'
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from .._progress import tqdm

from ..errors import InterpError, InterpWarning
from ..hooks.names import resolve_block
from ..runtime.source import ActivationSource, n_batches, token_norms
from .formation import MIN_FORMED_GAIN, formed_mask
from .presets import check_preset_model
from .spec import DetectionSpec
from .survey import Survey, formed_verdict, judge_block, survey_of
from .thresholds import Threshold, ThresholdSpec, parse_threshold, percentile_value


def _block_norms(source: ActivationSource, layers: Sequence[int], with_input: bool, batch_size: int = 16,
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

    def check(self, source: ActivationSource) -> "Detection":
        """This detection, after checking it was made on ``source`` (same images and weights); raises
        InterpError otherwise."""
        if tuple(source.ids) != self.ids or source.fingerprint != self.fingerprint:
            raise InterpError("this detection was computed on other images or weights than the source; "
                              "make it with detect(source, spec) on the same source")
        return self


def detect(source: ActivationSource, spec: Union[DetectionSpec, "Detection", None] = None,
           options: Optional["RunOptions"] = None, *,
           norms: Optional[Mapping[str, torch.Tensor]] = None) -> Detection:
    """The one way to a :class:`Detection`: ``spec`` resolved on ``source`` (its preset applied and checked on
    the model), or a Detection already made, checked against ``source`` (same images and weights) and
    returned as it is.

    Args:
        source: the images and model (or cache) to detect on.
        spec: what counts as a high-norm token (None: ``DetectionSpec()``, "auto" and the block chosen), or a
            Detection made on this source.
        options: how the pass runs (batch size, progress bars; :class:`RunOptions`).
        norms: ``{hook: [N, t]}`` every token's norm (or ``[N, P]`` the patch tokens') at hooks a pass already
            read on ``source`` (e.g.
            :class:`~interp.runtime.forward.Baseline`'s ``norms``, made with ``spec.hooks(source.blocks)``): no
            pass of its own then. The spec's block (or, when it names none, every block whose
            ``hook_resid_post`` is there) is judged; ``blocks.0.hook_resid_pre`` there is the input compared
            with.

    With a block named, that block decides; without, every block the source has is judged in the same pass
    and the block is chosen where the artifacts are (:mod:`interp.detection.survey`: the last block when none
    has any, else the last block with artifacts of the stage where they are strongest).
    """
    if isinstance(spec, Detection):
        if norms is not None:
            raise InterpError("norms= make a new detection from a spec; a Detection given is used as it is")
        return spec.check(source)
    if spec is None:
        spec = DetectionSpec()
    elif not isinstance(spec, DetectionSpec):
        raise InterpError(f"detection takes a Detection or a DetectionSpec, not {type(spec).__name__}")
    spec = spec.resolved()
    check_preset_model(spec.preset, getattr(source, "model", None))
    o = options or RunOptions()
    n, names = source.n_layers, source.blocks
    if spec.detect_layer is not None:
        layers = [resolve_block(spec.detect_layer, n)]
    elif norms is not None:
        layers = [i for i in range(n) if names.resid_post(i) in norms]
    else:
        layers = [i for i in range(n) if source.has(names.resid_post(i))] or [n - 1]
    if norms is None:
        patch, entry = _block_norms(source, layers, True, o.batch_for(source), o.progress)
    else:
        patch, entry = _norms_read(source, layers, norms)
    found = _detection(source, spec.threshold, layers, patch, entry, spec.detect_layer is None)
    return replace(found, preset=spec.preset)


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


def _norms_read(source: ActivationSource, layers: Sequence[int], norms: Mapping[str, torch.Tensor]
                ) -> Tuple[Dict[int, torch.Tensor], Optional[torch.Tensor]]:
    """The patch-token norms of ``layers`` ({layer: [N, P]}) and of the input ([N, P_0] or None) from token norms
    ``{hook: [N, t] or [N, P]}`` read by another pass; an error naming a missing block."""
    names = source.blocks
    missing = [names.resid_post(i) for i in layers if names.resid_post(i) not in norms]
    if missing or not layers:
        raise InterpError(f"norms= holds no token norms at {', '.join(missing) or 'any block output'}: read "
                          "them in the pass (spec.hooks(source.blocks))")

    def patches(hook: str) -> torch.Tensor:
        layout = source.layout_of(hook)
        rows = norms[hook]
        return rows if rows.shape[1] == layout.n_patches else rows[:, layout.patch_slice]

    entry = names.resid_pre(0)
    return ({i: patches(names.resid_post(i)) for i in layers},
            patches(entry) if entry in norms else None)


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
    """How a pass runs (never what it computes): what :func:`detect` and the studies' own passes read.

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


DetectionLike = Union[Detection, DetectionSpec, None]  # what a study's ``detection=`` takes


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
