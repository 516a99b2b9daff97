"""Register neurons (Jiang et al.; docs/methods.md section 2): MLP neurons whose activation concentrates on
the high-norm tokens.

By default this is the reference code's ``find_register_neurons`` (``nickjiang2378/test-time-registers``,
``shared/algorithms.py``), streamed through :class:`~interp.studies.artifacts.register_scores.RegisterScoreAccumulator`:

score[l, n] = mean over images with outliers of ( mean over outlier positions p of |a[l, n](p)| ),
a = ``blocks.{l}.mlp.hook_post`` (after the non-linearity; for SwiGLU the fc2 input). Outlier positions are
ALL tokens (CLS and registers included, ``positions="all"``) of ``detect_layer``'s ``hook_resid_post`` whose
norm is strictly above the threshold; images without outliers are skipped. The optional sparsity filter
(``sparsity="per_image"``, the reference notebook's) zeroes a neuron's score for an image unless at least
half of that image's tokens have activation below 0.5. ``positions="patches"`` and ``sparsity="pooled"``
keep this project's earlier behaviour as named options. Layers above ``highest_layer`` are not ranked.

A detection ``preset`` (:mod:`interp.detection.presets`) fills the published settings; explicit arguments win.

>>> r = neurons_study(source, top_k=4, progress=False)   # or detection=DetectionSpec(preset="jiang-dinov2-l14")
>>> r.neuron_dict(), r.artifacts_found, r.warning                          # the planted neurons
({2: [17, 101, 402, 655]}, True, None)
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ...detection.detection import DetectionLike, RunOptions, detect, detection_header, detection_params
from ...detection.detection import Detection
from ...detection.thresholds import Threshold, ThresholdSpec
from ...errors import InterpError
from ...detection.presets import resolve_preset
from .register_scores import RegisterScoreAccumulator, rank_neurons
from ..core.result import OutlierStudyResult, skipped_records
from ...runtime.passes import Fold, Reading, read_pass, run_readings
from ...runtime.source import ActivationSource, token_norms
from ..declaration import study
from .configs import NeuronsConfig
from ...hooks.names import resolve_block

SHOWN_NEURONS = 50  # neuron ids printed on the terminal


@dataclass
class NeuronsResult(OutlierStudyResult):
    """Result of :func:`neurons_study`.

    Attributes:
        neurons: ``[{"layer", "neuron", "score"}]``, best first (at most ``top_k``; empty when nothing to rank).
        layer_max_score: per block up to ``highest_layer``, its best neuron's score (how register-like each
            layer gets; 0 for the blocks below ``lowest_layer``, not scored).
        lowest_layer: the first block scored: 0, or on a pyramid model the first block of the detection block's
            stage (outliers are tokens of that stage's grid).
        positions, sparsity, preset: the resolved options (``sparsity`` None = no filter).
        artifacts_found: whether the detection norms have a separated high-norm mode with tokens in it.
        warning: why the ranking does not describe register artifacts (None when artifacts were found).
        message: why the list is empty, when it is.
    """

    study = "neurons"
    highest_layer: int = -1
    lowest_layer: int = 0
    top_k: int = 10
    positions: str = "all"
    sparsity: Optional[str] = None
    sparsity_filter: bool = False
    n_images: int = 0
    n_images_with_outliers: int = 0
    n_outlier_tokens: int = 0
    image_ids: List[str] = field(default_factory=list)
    neurons: List[Dict] = field(default_factory=list)
    layer_max_score: List[float] = field(default_factory=list)
    message: str = ""

    def console_lines(self, config=None) -> List[str]:
        """A note when more neurons were asked for than exist, then the ranked neurons (the first
        :data:`SHOWN_NEURONS`; neurons.json holds them all) or why there are none."""
        asked = getattr(config, "top_k", None)
        lines = []
        if asked is not None and self.neurons and asked > self.top_k:
            lines.append(f"note: --top-k {asked} is more than the {self.top_k} neurons of blocks "
                         f"0..{self.highest_layer}: all {self.top_k} are ranked (neurons.json records top_k "
                         f"{self.top_k})")
        shown = [f"{e['layer']}:{e['neuron']}" for e in self.neurons[:SHOWN_NEURONS]]
        more = len(self.neurons) - len(shown)
        lines.append(", ".join(shown) + (f" ... and {more} more (all in neurons.json)" if more > 0 else "")
                     or self.message)
        return lines

    def neuron_dict(self) -> Dict[int, List[int]]:
        """``{layer: [neuron, ...]}`` of the ranked neurons (the form interventions take)."""
        out: Dict[int, List[int]] = {}
        for entry in self.neurons:
            out.setdefault(int(entry["layer"]), []).append(int(entry["neuron"]))
        return out


def resolve_neuron_options(preset: Optional[str], *, highest_layer=None, top_k=None, positions=None, sparsity=None,
                           sparsity_filter: Optional[bool] = None) -> Dict[str, Any]:
    """The neurons study's settings beside the detection (``highest_layer``, ``top_k``, ``positions``,
    ``sparsity``): explicit arguments, then the preset's, then the defaults (positions "all", no sparsity filter,
    top_k 10; ``highest_layer`` absent: the detection block). ``sparsity_filter=True`` means
    ``sparsity="per_image"`` (False: no filter) unless ``sparsity`` is given."""
    if sparsity is None and sparsity_filter is not None:
        sparsity = "per_image" if sparsity_filter else "none"
    opts = resolve_preset(preset, highest_layer=highest_layer, top_k=top_k, positions=positions, sparsity=sparsity)
    for key in ("threshold", "detect_layer"):  # the detection's, resolved by its spec
        opts.pop(key, None)
    opts.setdefault("positions", "all")
    opts.setdefault("top_k", 10)
    opts["sparsity"] = None if opts.get("sparsity") in (None, "none") else opts["sparsity"]
    return opts


def _choose_images(n_images: int, max_images: Optional[int], seed: int) -> Optional[set]:
    """A seeded random subset of image indices (the reference notebook samples images, then skips those
    without outliers), or None for all images."""
    if max_images is None or n_images <= max_images:
        return None
    return set(random.Random(seed).sample(range(n_images), max_images))


class _NeuronScores:
    """The scoring pass of :func:`score_register_neurons` as a fold (blocks ``0..highest``' MLP activations
    and the detection block's token norms) and what it folded: ``acc`` and the used image indices."""

    def __init__(self, source: ActivationSource, detect: int, highest: int, threshold: "float | Threshold", *,
                 positions: str = "all", sparsity: Optional[str] = None, chosen: Optional[set] = None,
                 exclude: Optional[torch.Tensor] = None):
        names = source.blocks
        self.det_hook, self.highest, self.threshold = names.resid_post(detect), highest, threshold
        self.lowest = scored_from(source, detect, highest)
        self.hooks = [names.mlp_post(l) for l in range(self.lowest, highest + 1)]
        self.positions, self.sparsity, self.chosen = positions, sparsity, chosen
        self.patch_slice = source.layout_of(self.det_hook).patch_slice
        self.acc: Optional[RegisterScoreAccumulator] = None
        self.used: List[int] = []
        self.exclude = exclude  # Bool[N, P]: tokens above the threshold that are not outliers (from the input)

    def as_fold(self) -> Fold:
        return Fold(self.hooks + [self.det_hook], self.add, {self.det_hook: token_norms})

    def add(self, batch) -> None:
        rows = [j for j in range(len(batch)) if self.chosen is None or batch.start + j in self.chosen]
        if not rows:
            return
        if self.acc is None:
            self.acc = RegisterScoreAccumulator(len(self.hooks), batch.acts[self.hooks[0]].shape[-1],
                                                positions=self.positions, sparsity=self.sparsity,
                                                patch_slice=self.patch_slice)
        acts = {l: batch.acts[h][rows] for l, h in enumerate(self.hooks)}  # {l: [b, t, m]}
        cut = self.threshold.cuts([batch.start + j for j in rows]) if isinstance(self.threshold, Threshold) \
            else self.threshold  # "auto": each image above its own cut, as the detection's outliers
        norms = batch.acts[self.det_hook][rows]
        if self.exclude is not None and self.exclude.any():
            norms = norms.clone()  # tokens carried from the input: below every cut
            norms[:, self.patch_slice] *= ~self.exclude[[batch.start + j for j in rows]]
        hit = self.acc.update(acts, norms, cut)  # [b]
        self.used += [batch.start + j for j, h in zip(rows, hit.tolist()) if h]


def scored_from(source: ActivationSource, detect: int, highest: int) -> int:
    """The first block whose neurons are scored: 0, or on a pyramid model the first block on the detection
    block's grid (outlier positions are tokens of that grid; blocks of earlier stages have other tokens).

    Raises:
        InterpError: ``highest`` is a block of an earlier stage than the detection block's.
    """
    names = source.blocks
    grid = source.layout_of(names.resid_post(detect)).grid
    lowest = highest
    while lowest > 0 and source.layout_of(names.mlp_post(lowest - 1)).grid == grid:
        lowest -= 1
    if source.layout_of(names.mlp_post(highest)).grid != grid:
        raise InterpError(f"highest layer {names.label(highest)} runs on another grid than the detection block "
                          f"{names.label(detect)}: register neurons are scored on the outliers' own stage; give a "
                          "highest layer of that stage")
    return lowest


def score_register_neurons(source: ActivationSource, detect: int, highest: int, threshold: float, *,
                           positions: str = "all", sparsity: Optional[str] = None, chosen: Optional[set] = None,
                           batch_size: int = 16, progress: bool = True):
    """One pass: the register-neuron score table of blocks ``0..highest``.

    Returns:
        (accumulator, used image indices): ``accumulator.finalize()`` is the float64 [highest + 1 - lowest, d_mlp]
        table of blocks ``lowest..highest`` (:func:`scored_from`: 0 on a single-grid model).
    """
    scores = _NeuronScores(source, detect, highest, threshold, positions=positions, sparsity=sparsity,
                           chosen=chosen)
    read_pass(source, [scores.as_fold()], batch_size, progress, "neuron scores")
    return scores.acc, scores.used


@study(NeuronsConfig)
def neurons_study(source: ActivationSource, config: NeuronsConfig, *, detection: DetectionLike,
                  progress: bool = True) -> NeuronsResult:
    """Rank register neurons.

    Args:
        source: live model over images, or a cache holding ``blocks.*.mlp.hook_post`` (layers <= highest_layer)
            and the detection layer's ``hook_resid_post`` (full vectors or ``--norms-only``).
        config: the options (:class:`~interp.studies.artifacts.configs.NeuronsConfig`; or pass them as
            keywords): ``highest_layer`` the last layer whose neurons are scored
            (default: the detection layer; capped at the last); ``top_k`` how many neurons to return (default
            10); ``positions`` ``"all"`` (default, reference) or ``"patches"``; ``sparsity`` ``"per_image"``
            (reference notebook), ``"pooled"`` or ``"none"`` (default none); ``sparsity_filter`` shorthand: True =
            ``"per_image"``, False = ``"none"`` (``sparsity`` wins); ``max_images`` score on a seeded random
            subset of this many images (deterministic for ``seed``). The detection's preset fills what is not
            given (:func:`resolve_neuron_options`).
        detection: the high-norm tokens, as in the norms study: a Detection made on this source (no detection
            pass then) or a DetectionSpec (default the config's: "auto", the block chosen). Under "auto" without
            a separated high-norm mode nothing is ranked; under a fixed or percentile threshold the ranking is
            made, with ``artifacts_found=False`` and a ``warning``, also raised with ``warnings.warn``.
        progress: show progress bars.
    """
    c, batch_size = config, source.batch_size
    found = detect(source, detection, RunOptions(batch_size, progress=progress))
    opts = resolve_neuron_options(found.preset, highest_layer=c.highest_layer, top_k=c.top_k, positions=c.positions,
                                  sparsity=c.sparsity, sparsity_filter=c.sparsity_filter)
    reading = neurons_reading(source, found, highest_layer=opts.get("highest_layer"), top_k=opts["top_k"],
                              positions=opts["positions"], sparsity=opts["sparsity"], max_images=c.max_images,
                              seed=c.seed, batch_size=batch_size)
    return run_readings(source, [reading], batch_size, progress, "neuron scores")[0]


def neurons_reading(source: ActivationSource, found: Detection, *, highest_layer: Optional[int] = None,
                    top_k: int = 10, positions: str = "all", sparsity: Optional[str] = None,
                    max_images: Optional[int] = None, seed: int = 0, batch_size: int = 16) -> Reading:
    """:func:`neurons_study` around its scoring pass, with the detection ``found`` made already and the options
    resolved (:func:`resolve_neuron_options`): no fold when nothing can be ranked (no finite threshold)."""
    found.check(source)
    detect, thr = found.layer, found.threshold
    highest = min(resolve_block(found.layer if highest_layer is None else highest_layer, source.n_layers),
                  source.n_layers - 1)
    header = detection_header(found, "neurons")
    params = {**detection_params(found), "highest_layer": highest, "top_k": top_k, "positions": positions,
              "sparsity": sparsity, "max_images": max_images, "batch_size": batch_size}
    base = dict(model=source.model_name, fingerprint=source.fingerprint, params=params, seed=seed,
                ids=list(source.ids), skipped=skipped_records(source), **header, highest_layer=highest,
                top_k=top_k, positions=positions, sparsity=sparsity, sparsity_filter=sparsity is not None,
                n_images=len(source))
    if not np.isfinite(thr.value):
        return Reading([], lambda: NeuronsResult(**base, message=f"no outliers at block {detect}: the detection "
                       "layer's norm distribution has no separated high-norm mode; nothing to rank"))
    scores = _NeuronScores(source, detect, highest, thr, positions=positions, sparsity=sparsity,
                           chosen=_choose_images(len(source), max_images, seed), exclude=found.from_input)

    def finish() -> NeuronsResult:
        if not scores.used:
            return NeuronsResult(**base, message=f"no outliers at block {detect}: no token exceeds the threshold "
                                 f"{thr.value:.4g}; nothing to rank")
        scored = scores.acc.finalize()  # [highest + 1 - lowest, d_mlp] float64
        table = torch.cat([scored.new_zeros(scores.lowest, scored.shape[1]), scored])  # blocks not scored: 0
        kept = min(top_k, scored.numel())  # a --top-k above the neurons that exist records the count kept
        return NeuronsResult(
            **{**base, "top_k": kept, "params": {**params, "top_k": kept}}, n_images_with_outliers=len(scores.used), n_outlier_tokens=scores.acc.n_outlier_tokens,
            image_ids=[source.ids[i] for i in scores.used], lowest_layer=scores.lowest,
            neurons=rank_neurons(table, top_k, highest, lowest_layer=scores.lowest),
            layer_max_score=[float(v) for v in table.clamp_min(0).max(1).values],
        )

    return Reading([scores.as_fold()], finish)
