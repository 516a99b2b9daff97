"""High-norm tokens (Darcet et al.; docs/methods.md sections 1-2): per-layer norm statistics of the
un-normalised residual stream, outlier detection, outlier maps, the emergence layer, and where CLS attends.

>>> from interp.studies import open_source
>>> result = norms_study(open_source(model=model, images=photos), progress=False)   # "auto", the block chosen
>>> result.artifacts_found, result.emergence["layer"], result.emergence["component"]   # planted after block 2's MLP
(True, 2, 'mlp')
>>> from interp.detection.detection import RunOptions, detect
>>> from interp.detection.spec import DetectionSpec
>>> found = detect(source, DetectionSpec(threshold="p98"), RunOptions(progress=False))
>>> shared = norms_study(source, detection=found, progress=False)          # a shared detection: no pass of its own
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ...hooks.names import RESID_STAGES as STAGES
from .emergence import EmergenceAccumulator, find_detected_emergence, find_emergence
from ...detection.detection import DetectionLike, RunOptions, detect, detection_header, detection_params
from ...detection.detection import Detection
from ...runtime.passes import Fold, Reading, run_readings
from ..core.result import OutlierStudyResult, skipped_records
from ...runtime.source import ActivationSource, token_norms
from ..declaration import study
from .configs import NormsConfig

# Log-spaced norm histogram bins shared by every layer: ~0.5 % wide, from 1e-3 to 1e6.
HIST_EDGES = np.logspace(-3, 6, 4001)
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
class NormsResult(OutlierStudyResult):
    """Result of :func:`norms_study`.

    Attributes:
        stats: stage ("resid_mid"/"resid_post") -> kind ("cls"/"registers"/"patches") -> per-layer list of
            {"median", "p99", "max"} (median and p99 from ~0.5 %-wide log bins; max exact; None if no token).
        histograms: stage -> per layer {"start", "counts"}: patch-norm counts over ``hist_edges[start:]``
            (log-spaced bins; empty ends trimmed).
        threshold: outlier threshold at ``detect_layer`` (None = no outliers: distribution not bimodal under "auto").
        bimodal, mode_ratio: the two-mode test's verdict and fitted upper/lower mode ratio (a diagnostic for a
            fixed threshold, never a veto).
        detection: the threshold's diagnostics (:meth:`~interp.detection.thresholds.Threshold.to_dict`): share above
            it, the verdict and its reason, and the two-mode fit (modes, separation, BIC, accepted, reason).
        detection_message: the same in one line, e.g. "block 11: artifacts found: 2.60 % of the patch tokens ...".
        survey: each block's verdict when the detection block was chosen, not given
            (:meth:`~interp.detection.survey.Survey.to_dict`: "chosen", "summary", "stages", "blocks"), else None.
        outlier_maps: [N][h][w] 0/1 outliers at ``detect_layer`` (patch tokens; ``grid`` is that block's grid).
        outlier_fraction_per_layer: share of patch tokens above ``threshold`` at each block output.
        blocks: the name of every block (``stage 2 block 1`` in a pyramid model), in order.
        emergence: the step (attention or MLP of one block) where the max patch norm jumps by at least
            ``emergence_factor`` relative to the median patch norm, measured as Jiang et al. do
            (:func:`interp.studies.artifacts.emergence.find_emergence`): {"layer", "component", "jump", "factor",
            "relative_max", "steps"}; None when no artifacts were found.
        emergence_detected: the first step from which the detected tokens' norms stay separated from the other
            patches' through the detection block (Ashman's D >= 2 and >= 2x, docs/methods.md section 2;
            :func:`~interp.studies.artifacts.emergence.find_detected_emergence`): {"layer", "component",
            "separation", "ratio", "min_separation", "min_ratio", "steps"}; None when none is found.
        emergence_curves: the per-layer means over images (Jiang et al.'s notebook): "max_patch_norm" and
            "median_patch_norm" (stage -> [L], each image's max / median patch norm) and "cls_attention_max"
            ([L], each image's max over patches of the head-mean CLS->patch attention; None without patterns).
        cls_attention_max: per layer, max over images and patches of CLS->patch attention (head mean), or
            None when attention patterns were not available.
        cls_attention_on_outliers: per layer, mean share of CLS->patch attention on outlier patches.
    """

    study = "norms"
    n_layers: int = 0
    grid: List[int] = field(default_factory=list)
    blocks: List[str] = field(default_factory=list)
    bimodal: bool = False
    mode_ratio: float = 1.0
    detection: Dict = field(default_factory=dict)
    detection_message: str = ""
    survey: Optional[Dict] = None
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
    emergence_detected: Optional[Dict] = None
    emergence_curves: Dict = field(default_factory=dict)
    cls_attention_max: Optional[List[float]] = None
    cls_attention_on_outliers: Optional[List[float]] = None

    def console_lines(self, config=None) -> List[str]:
        return [self.detection_message]  # the verdict with the numbers behind it (share above, fitted modes)

    def outlier_map_tensor(self) -> torch.Tensor:
        """Outlier maps as Bool[N, h, w]."""
        return torch.tensor(self.outlier_maps, dtype=torch.bool).reshape(len(self.ids), *self.grid)


@dataclass
class _LayerTally:
    """Running per-layer statistics over the batches of :func:`norms_study` (numpy, one row per block)."""

    n_layers: int
    use_attention: bool
    detect_layer: int = -1  # the detection's outliers are followed on the blocks that share its grid
    counts: Dict = field(init=False)
    maxima: Dict = field(init=False)
    n_images: int = 0

    def __post_init__(self):
        bins = len(HIST_EDGES) - 1
        self.counts = {s: {k: np.zeros((self.n_layers, bins), np.int64) for k in KINDS} for s in STAGES}
        self.maxima = {s: {k: np.full(self.n_layers, -np.inf) for k in KINDS} for s in STAGES}
        self.above = np.zeros(self.n_layers, np.int64)
        self.n_patches = np.zeros(self.n_layers, np.int64)  # patch tokens seen per block
        self.attn_max = np.zeros(self.n_layers)
        self.attn_share = np.zeros(self.n_layers)
        self.emergence = EmergenceAccumulator(self.n_layers)

    def add(self, batch, outliers: torch.Tensor, threshold: "float | torch.Tensor") -> None:
        """Fold one batch in; ``outliers`` Bool[b, P] are the batch's detection-layer outliers. Token rows are
        told apart with the batch's own layout (the forward that produced it), per block (pyramid stages have
        their own grids; the outliers are followed on the blocks on the detection block's grid)."""
        names = batch.blocks
        det_grid = batch.layout.for_block(self.detect_layer).grid
        for i in range(self.n_layers):
            lay = batch.layout.for_block(i)
            patches = lay.patch_slice
            followed = outliers if lay.grid == det_grid else None
            for s in STAGES:
                norms = batch.acts[names.resid_stage(i, s)]  # [b, t]
                self.emergence.update(s, i, norms[:, patches], followed)
                for k, sl in lay.kind_slices().items():
                    vals = norms[:, sl].reshape(-1).numpy()
                    if vals.size:
                        self.counts[s][k][i] += np.histogram(np.clip(vals, HIST_EDGES[0], HIST_EDGES[-1]),
                                                             HIST_EDGES)[0]
                        self.maxima[s][k][i] = max(self.maxima[s][k][i], float(vals.max()))
            self.above[i] += int((batch.acts[names.resid_post(i)][:, patches].double() > threshold).sum())
            self.n_patches[i] += len(batch) * lay.n_patches
            if self.use_attention:
                row = batch.acts[names.attn_pattern(i)][:, patches]  # [b, P]
                self.emergence.update_attention(i, row)
                self.attn_max[i] = max(self.attn_max[i], float(row.max()))
                share = (row * outliers).sum(1) / row.sum(1).clamp_min(1e-12)
                self.attn_share[i] += float(share.sum())
        self.n_images += len(batch)

    def stat(self, s: str, k: str, i: int) -> Dict:
        c = self.counts[s][k][i]
        if c.sum() == 0:
            return {"median": None, "p99": None, "max": None}
        top = float(self.maxima[s][k][i])
        return {"median": min(_hist_quantile(c, 0.5), top), "p99": min(_hist_quantile(c, 0.99), top), "max": top}


def _layer_hooks(source: ActivationSource, attention: bool) -> Tuple[List[str], Dict, bool]:
    """(hooks, reducers, whether CLS attention is measured) of the per-layer pass."""
    lay, n_layers, names = source.layout, source.n_layers, source.blocks
    hooks = [names.resid_stage(i, s) for i in range(n_layers) for s in STAGES]
    reduce = {h: token_norms for h in hooks}
    pattern_hooks = [names.attn_pattern(i) for i in range(n_layers)]
    use_attention = attention and lay.cls_index is not None and all(source.has(h) for h in pattern_hooks) and (
        source.is_live or not source.norms_only)
    if use_attention:
        cls = lay.cls_index  # row 0 whatever the edits (test-time registers go after it)
        for h in pattern_hooks:
            reduce[h] = lambda p, c=cls: p[:, :, c].float().mean(1)  # [b, t] head-mean CLS row
        hooks += pattern_hooks
    return hooks, reduce, use_attention


@study(NormsConfig)
def norms_study(source: ActivationSource, config: NormsConfig, *, detection: DetectionLike,
                progress: bool = True) -> NormsResult:
    """Norm statistics per layer and token kind, outliers, emergence layer and CLS attention.

    Args:
        source: a live model over images, or a cache with ``blocks.*.hook_resid_mid``/``hook_resid_post``
            (full activations or ``--norms-only``); attention needs ``blocks.*.attn.hook_pattern`` (live: always).
        config: the options (:class:`~interp.studies.artifacts.configs.NormsConfig`; or pass them as keywords):
            ``emergence_factor`` how much one step must raise the max patch norm to count as emergence;
            ``attention`` measure CLS->patch attention per layer (skipped for caches without patterns).
        detection: the high-norm tokens: a Detection made on this source by
            :func:`~interp.detection.detection.detect` (no detection pass then), or a
            :class:`~interp.detection.spec.DetectionSpec` (default the config's): ``threshold`` a norm, ``"pNN"``
            (per-model percentile of the detection layer's patch norms) or ``"auto"`` (default; a two-mode fit on
            log norms, :func:`~interp.detection.norm_split.split_norms`; no outliers when the distribution has no
            separated minority high-norm mode; a fixed value's outliers are the tokens above it, artifacts when
            they are at most 20 % of the patch tokens; a percentile's are artifacts when the two-mode test finds a
            separated mode); ``detect_layer`` the block whose output decides outliers; ``preset`` published
            detection settings (``darcet``, ``reassessment``, ``jiang-*``; explicit values win).
        progress: show progress bars.
    """
    batch_size = source.batch_size
    det = detect(source, detection, RunOptions(batch_size, progress=progress))
    reading = norms_reading(source, det, emergence_factor=config.emergence_factor, attention=config.attention,
                            batch_size=batch_size)
    return run_readings(source, [reading], batch_size, progress, "norms per layer")[0]


def norms_reading(source: ActivationSource, det: Detection, *, emergence_factor: float = 2.0,
                  attention: bool = True, batch_size: int = 16) -> Reading:
    """:func:`norms_study` around its pass, with the detection ``det`` made already: the fold that tallies
    each batch's per-layer norms and CLS attention, then the :class:`NormsResult` (for a shared pass,
    :mod:`interp.runtime.passes`)."""
    det.check(source)
    hooks, reduce, use_attention = _layer_hooks(source, attention)
    tally = _LayerTally(source.n_layers, use_attention, det.layer)
    outliers = det.outliers  # [N, P]

    def fold(batch) -> None:
        rows = range(batch.start, batch.start + len(batch))  # each image above its own cut, as det.outliers
        tally.add(batch, outliers[batch.start:batch.start + len(batch)], det.threshold.cuts(rows))

    return Reading([Fold(hooks, fold, reduce)],
                   lambda: _norms_result(source, det, tally, emergence_factor, attention, batch_size))


def _norms_result(source: ActivationSource, det: Detection, tally: "_LayerTally", emergence_factor: float,
                  attention: bool, batch_size: int) -> NormsResult:
    lay, n_layers, use_attention = source.layout.for_block(det.layer), source.n_layers, tally.use_attention
    outliers, thr = det.outliers, det.threshold
    stats = {s: {k: [tally.stat(s, k, i) for i in range(n_layers)] for k in KINDS} for s in STAGES}
    max_post = [float(v) for v in tally.maxima["resid_post"]["patches"]]
    max_mid = [float(v) for v in tally.maxima["resid_mid"]["patches"]]
    curves = tally.emergence.finalize()
    header = detection_header(det, "norms", warn=False)
    emergence = find_emergence(curves, factor=emergence_factor, artifacts_found=header["artifacts_found"]) \
        if n_layers else None
    emergence_detected = find_detected_emergence(curves, det.layer, artifacts_found=header["artifacts_found"])
    n_images = tally.n_images
    params = {**detection_params(det), "emergence_factor": emergence_factor, "attention": attention, "batch_size": batch_size}
    return NormsResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None,
        ids=list(source.ids), skipped=skipped_records(source), n_layers=n_layers, grid=list(lay.grid),
        blocks=[source.blocks.label(i) for i in range(n_layers)], **header,
        bimodal=thr.bimodal, mode_ratio=thr.mode_ratio,
        detection=thr.to_dict(), detection_message=f"{source.blocks.label(det.layer)}: {det.describe()}"
        + ("" if det.survey is None else f" (where: {det.survey.describe()})"),
        survey=None if det.survey is None else det.survey.to_dict(),
        outlier_fraction=float(outliers.float().mean()) if outliers.numel() else 0.0,
        outlier_counts=outliers.sum(1).tolist(),
        outlier_maps=outliers.reshape(-1, *lay.grid).int().tolist(),
        outlier_fraction_per_layer=(tally.above / np.maximum(tally.n_patches, 1)).tolist(),
        stats=stats, max_patch_norm={"resid_mid": max_mid, "resid_post": max_post},
        median_patch_norm={s: [stats[s]["patches"][i]["median"] for i in range(n_layers)] for s in STAGES},
        histograms={s: [_trim(c) for c in tally.counts[s]["patches"]] for s in STAGES},
        hist_edges=HIST_EDGES.tolist(),
        emergence=emergence, emergence_detected=emergence_detected,
        emergence_curves={"max_patch_norm": curves.max_patch_norm, "median_patch_norm": curves.median_patch_norm,
                          "cls_attention_max": curves.cls_attention_max},
        cls_attention_max=tally.attn_max.tolist() if use_attention else None,
        cls_attention_on_outliers=(tally.attn_share / max(n_images, 1)).tolist() if use_attention else None,
    )
