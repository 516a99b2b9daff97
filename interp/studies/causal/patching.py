"""Activation patching (docs/causal.md): the clean activation of one site patched into the corrupted run
(denoising) or the corrupted one into the clean run (noising), one cell at a time, and the metric read after.

>>> from interp.studies import open_source
>>> two = open_source(model=model, images=images[:2])       # every token of block 2: 197 cells
>>> result = patching_study(two, site="mlp_out", blocks=(2,), metric="outliers", corruption="noise", progress=False)
>>> result.peak()["cell"].startswith("patch")   # planted_vit: block 2's MLP forms the artifacts on patches
True

The arithmetic is TransformerLens's ``generic_activation_patch`` with ``layer_pos_patch_setter`` (a token's
row), ``layer_head_vector_patch_setter`` (a head at every token) or a neuron at every token: the patched run is
the base run with the donor's values at that cell, the metric the mean over images, the normalised effect
``(patched - corrupted) / (clean - corrupted)``. The cells of a sweep are batched: one forward carries ``cells``
copies of the batch, copy i patched at cell i (:mod:`interp.runtime.patching`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..._progress import tqdm
from ...detection.detection import DetectionLike, RunOptions, detect
from ...errors import InterpError
from ...runtime.patching import ActivationPatch, repeat_batch
from ...runtime.source import n_batches, require_live
from ..core.result import StudyResult, skipped_records
from ..declaration import study
from ...models.classifiers.classifier import Classifier
from .configs import PatchingConfig, PatchingOptions
from .corruptions import Corruption, aligned, make_corruption
from .sweep import (MetricSpec, Site, cell_labels, metric_classifier, metric_spec, normalised, sites, spearman,
                    with_cells)


@dataclass
class SweepResult(StudyResult):
    """What a patching or attribution sweep reports (block x cell tables; :class:`PatchingResult`).

    Attributes:
        site: the hook leaf swept (``resid_post``, ``z``, ``mlp_post``...); cell_kind: "token", "head", "neuron".
        metric, direction, corruption: what was measured, which way, against which corrupted input.
        block_ids: the swept blocks (indices); block_labels: their names; cells: per block, each cell's label.
        values: per block, per cell, the metric after patching (mean over images; attribution: its estimate).
        normalized: per block, per cell, ``(value - corrupted) / (clean - corrupted)`` when denoising,
            ``(value - clean) / (corrupted - clean)`` when noising (0: no effect; 1: the whole difference).
        clean, corrupted: the metric of the unpatched clean and corrupted runs (mean over images).
        layouts: per block, its token rows' {"grid", "n_prefix"} (token sweeps: the patch map).
        threshold, detect_layer: the outlier metric's norm threshold and block (None for other metrics).
        attention: token sweeps on a model with a CLS token: per block, the clean run's CLS attention row (head
            mean, mean over images, every token); attention_rank: per block, the Spearman correlation over the
            patches of that row and the normalised effects (does attention to a patch predict its effect?).
    """

    site: str = ""
    cell_kind: str = "token"
    metric: str = ""
    direction: str = "denoise"
    corruption: str = "image"
    block_ids: List[int] = field(default_factory=list)
    block_labels: List[str] = field(default_factory=list)
    cells: List[List[str]] = field(default_factory=list)
    values: List[List[float]] = field(default_factory=list)
    normalized: List[List[float]] = field(default_factory=list)
    clean: float = 0.0
    corrupted: float = 0.0
    layouts: List[Dict] = field(default_factory=list)
    threshold: Optional[float] = None
    detect_layer: Optional[int] = None
    n_images: int = 0
    notes: List[str] = field(default_factory=list)
    attention: Optional[List[List[float]]] = None
    attention_rank: Optional[List[Optional[float]]] = None

    def peak(self) -> Dict:
        """The cell with the largest |normalised effect|: {"block", "cell", "normalized"}."""
        best = max(((abs(v), i, j) for i, row in enumerate(self.normalized) for j, v in enumerate(row)
                    if v == v), default=None)
        if best is None:
            return {"block": None, "cell": None, "normalized": None}
        _, i, j = best
        return {"block": self.block_ids[i], "cell": self.cells[i][j], "normalized": self.normalized[i][j]}

    def console_lines(self, config=None) -> List[str]:
        peak = self.peak()
        return [f"{self.metric}: clean {self.clean:.4g}, corrupted {self.corrupted:.4g}; largest effect "
                f"{peak['normalized'] if peak['normalized'] is None else round(peak['normalized'], 3)} at block "
                f"{peak['block']}, {peak['cell']}", *self.notes]


@dataclass
class PatchingResult(SweepResult):
    """Result of :func:`patching_study` (:class:`SweepResult`)."""

    study = "patching"


@dataclass
class Setup:
    """What every batch of a sweep shares: the sites, the corruption, the metric's classifier and, for the outlier
    metric, the detection block's hook, threshold and index."""

    found: List[Site]
    corruption: Corruption
    classifier: Optional[Classifier] = None
    outlier_hook: Optional[str] = None
    counting_threshold: Optional[float] = None
    detection_block: Optional[int] = None


@dataclass
class Prepared:
    """One batch ready to sweep: the base run's input and interventions, the donor's values on the base run's
    token rows, the base run's values, its metric and the base run's layout (the cells' labels)."""

    base: torch.Tensor
    base_edits: Tuple
    donor_acts: Dict[str, torch.Tensor]
    base_acts: Dict[str, torch.Tensor]
    spec: MetricSpec
    clean: torch.Tensor
    corrupted: torch.Tensor
    layout: object
    attention: Dict[int, torch.Tensor] = field(default_factory=dict)  # block -> clean CLS row [b, t] (head mean)


def _norm_reducer(source, det: Optional[str]):
    """Reducers of the outlier metric: the detection block's patch norms [b, P]."""
    if det is None:
        return None
    return lambda layout: {det: lambda t: t.float().norm(dim=-1)[:, source.blocks.layout_of(layout, det).patch_slice]}


def attention_hooks(source, found: List[Site]) -> Dict[int, str]:
    """{block: its attention pattern hook} of a token sweep on a model with a CLS token and one grid (the check
    that attention to a patch predicts its effect); empty otherwise."""
    layout = source.layout
    if not found or found[0].axis != 1 or layout.cls_index is None or layout.block_stages:
        return {}
    return {s.block: source.blocks.attn_pattern(s.block) for s in found}


def _clean_reducer(source, det: Optional[str], patterns: Dict[int, str]):
    """The clean run's reducers: the outlier metric's norms and each pattern's CLS row, head mean [b, t]."""
    norms = _norm_reducer(source, det)

    def reducers(layout):
        fns = dict(norms(layout)) if norms else {}
        fns.update({h: lambda t, c=layout.cls_index: t[:, :, c].float().mean(1) for h in patterns.values()})
        return fns

    return reducers


def prepare(source, config: PatchingOptions, x: torch.Tensor, start: int, setup: Setup) -> Prepared:
    """The clean and corrupted runs of batch ``x`` (every site's full values kept), the metric and its values."""
    found, det = setup.found, setup.outlier_hook
    runs = setup.corruption.runs(x, start)
    hooks = [s.hook for s in found] + ([det] if det else [])
    patterns = attention_hooks(source, found)
    clean = source.run(runs.clean, hooks + list(patterns.values()), _clean_reducer(source, det, patterns),
                       runs.clean_edits, logits=True)
    bad = source.run(runs.corrupted, hooks, _norm_reducer(source, det), runs.corrupted_edits, logits=True)
    spec = metric_spec(config, clean.logits, clean.pooled, setup.counting_threshold, setup.classifier)
    norms = (lambda run: run.acts[det]) if det else (lambda run: None)
    denoise = config.direction == "denoise"
    donor, base = (clean, bad) if denoise else (bad, clean)
    with_cells(found, base.acts)
    blocks = source.blocks
    donor_acts = {s.hook: aligned(donor.acts[s.hook], base.acts[s.hook], blocks.layout_of(donor.layout, s.hook),
                                  blocks.layout_of(base.layout, s.hook)) for s in found}
    rows = {block: clean.acts[h] for block, h in patterns.items()}  # the clean CLS rows on the base run's tokens:
    attention = {block: aligned(row, row.new_zeros(len(row), base.layout.n_tokens), clean.layout, base.layout)
                 for block, row in rows.items()}
    return Prepared(runs.corrupted if denoise else runs.clean,
                    runs.corrupted_edits if denoise else runs.clean_edits, donor_acts, base.acts, spec,
                    spec.score(clean.logits, clean.pooled, norms(clean)),
                    spec.score(bad.logits, bad.pooled, norms(bad)), base.layout,
                    attention)


def patch_cells(source, prep: Prepared, site: Site, chunk: int, det: Optional[str]) -> torch.Tensor:
    """The metric [cells, b] of every cell of ``site`` patched into the base run, ``chunk`` cells per forward."""
    values = prep.donor_acts[site.hook]
    b = values.shape[0]
    out = []
    for i in range(0, len(site.cells), chunk):
        cells = site.cells[i:i + chunk]
        k = len(cells)
        patch = ActivationPatch(site.hook, repeat_batch(values, k), site.masks(values.shape, cells))
        run = source.run(repeat_batch(prep.base, k), [det] if det else [], _norm_reducer(source, det),
                         [*prep.base_edits, patch], logits=True)
        out.append(prep.spec.score(run.logits, run.pooled, run.acts[det] if det else None).view(k, b))
    return torch.cat(out)


def sweep_setup(source, config: PatchingOptions, detection: DetectionLike, progress: bool) -> Setup:
    """The sites, the corruption, the classifier and for the outlier metric the detection block."""
    require_live(source, f"{config.name} study")
    found = sites(source, config)
    setup = Setup(found, make_corruption(source, config), metric_classifier(source, config.classifier))
    if config.metric != "outliers":
        return setup
    det = detect(source, detection, RunOptions(source.batch_size, progress=progress))
    setup.outlier_hook, setup.counting_threshold = source.blocks.resid_post(det.layer), float(det.counting_threshold())
    setup.detection_block = det.layer
    return setup


def sweep_result(cls, source, config: PatchingOptions, found: List[Site], totals: Dict[int, torch.Tensor],
                 clean: float, corrupted: float, count: int, layout, threshold, detect_layer, notes,
                 attention: Optional[Dict[int, torch.Tensor]] = None) -> SweepResult:
    """The result of a sweep from its per-site totals (sums over images of each cell's value) and, for a token
    sweep, the clean CLS rows' sums per block (``attention``)."""
    blocks = source.blocks
    values = [(totals[s.block] / count) for s in found]
    lays = [blocks.layout_of(layout, s.hook) for s in found]
    if clean == corrupted:
        notes.append(f"the clean and corrupted runs have the same {config.metric} ({clean:.4g}): nothing to "
                     "recover, the normalised effects are undefined; choose another corruption or metric")
    base, donor = (corrupted, clean) if config.direction == "denoise" else (clean, corrupted)
    kind = {1: "token", 2: "head" if config.site == "z" else "neuron"}
    params = {k: getattr(config, k) for k in ("corruption", "noise", "box", "boxes", "masks", "fill", "blur_sigma",
                                               "register_neurons", "direction", "site", "metric", "classes",
                                               "blocks", "neurons", "cells", "classifier")}
    return cls(model=source.model_name, fingerprint=source.fingerprint, params=params, seed=config.seed,
               ids=list(source.ids), skipped=skipped_records(source), site=config.site,
               cell_kind=kind[found[0].axis] if found else "token", metric=config.metric,
               direction=config.direction, corruption=config.corruption, block_ids=[s.block for s in found],
               block_labels=[blocks.label(s.block) for s in found],
               cells=[cell_labels(s, lay) for s, lay in zip(found, lays)],
               values=[v.tolist() for v in values],
               normalized=[normalised(v, donor, base).tolist() for v in values], clean=clean,
               corrupted=corrupted, layouts=[{"grid": list(l.grid), "n_prefix": l.n_prefix} for l in lays],
               threshold=threshold, detect_layer=detect_layer, n_images=count, notes=notes,
               **attention_check(found, lays, attention, values, donor, base, count))


def attention_check(found: List[Site], lays, attention: Optional[Dict[int, torch.Tensor]], values, donor: float,
                    base: float, count: int) -> Dict:
    """Does the clean CLS attention to a patch predict the patch's effect? Per block, the Spearman correlation
    over the patches of the CLS row (head mean, mean over images) and the normalised effect."""
    if not attention:
        return {}
    rows, ranks = [], []
    for site, lay, value in zip(found, lays, values):
        row = attention[site.block] / count
        rows.append(row.tolist())
        effect = normalised(value, donor, base)[lay.patch_slice]
        ranks.append(spearman(row[lay.patch_slice], effect))
    return {"attention": rows, "attention_rank": ranks}


@dataclass
class Sweep:
    """A sweep's sums over the images: per named quantity, per block, each cell's sum [cells]; the unpatched
    runs' metric sums, the image count and what the result needs to label its cells."""

    setup: Setup
    totals: Dict[str, Dict[int, torch.Tensor]]
    clean: float
    corrupted: float
    count: int
    layout: object
    attention: Dict[int, torch.Tensor]

    def result(self, cls, source, config: PatchingOptions, name: str) -> SweepResult:
        setup = self.setup
        result = sweep_result(cls, source, config, setup.found, self.totals[name], self.clean / self.count,
                              self.corrupted / self.count, self.count, self.layout, setup.counting_threshold,
                              setup.detection_block, list(setup.corruption.notes(config.direction)), self.attention)
        if setup.classifier is not None:
            result.params["classifier"] = setup.classifier.record()
        return result


def run_sweep(source, config: PatchingOptions, detection: DetectionLike, progress: bool,
              visit: Callable[[Prepared, List[Site], Optional[str]], Dict[str, Dict[int, torch.Tensor]]]) -> Sweep:
    """Every batch of ``source`` prepared (:func:`prepare`), then ``visit(prep, sites, det)``: named values
    {block: [cells, b]}, summed over the images into the :class:`Sweep`."""
    setup = sweep_setup(source, config, detection, progress)
    totals: Dict[str, Dict[int, torch.Tensor]] = {}
    attention: Dict[int, torch.Tensor] = {}
    clean = corrupted = 0.0
    count, layout = 0, None
    for start, x in tqdm(source.image_batches(), disable=not progress, desc=config.name, unit="batch",
                         total=n_batches(source, None), leave=False):
        prep = prepare(source, config, x, start, setup)
        layout = prep.layout
        for name, per_block in visit(prep, setup.found, setup.outlier_hook).items():
            sums = totals.setdefault(name, {})
            for block, values in per_block.items():
                sums[block] = sums.get(block, 0) + values.sum(1)
        for block, row in prep.attention.items():
            attention[block] = attention.get(block, 0) + row.sum(0)
        clean += float(prep.clean.sum())
        corrupted += float(prep.corrupted.sum())
        count += len(x)
    if not count:
        raise InterpError(f"{config.name} needs at least one image")
    return Sweep(setup, totals, clean, corrupted, count, layout, attention)


@study(PatchingConfig)
def patching_study(source, config: PatchingConfig, *, detection: DetectionLike,
                   progress: bool = True) -> PatchingResult:
    """Activation patching over every cell of the chosen sites, on the images of a live ``source`` (module doc).

    Args:
        config: the two runs (``corruption``: ``noise``; ``box``, ``boxes`` or ``masks`` and ``fill``,
            ``blur_sigma``; ``register_neurons``), ``direction``, the sites (``site``, ``blocks``, ``neurons``), the
            ``metric`` (``classes``, ``classifier``) and ``cells`` per forward
            (:class:`~interp.studies.causal.configs.PatchingConfig`).
        detection: the "outliers" metric's high-norm tokens: a Detection made on this source by
            :func:`~interp.detection.detection.detect`, or a DetectionSpec (default the config's); unused by the
            other metrics.
    """
    def visit(prep, found, det):
        return {"patched": {site.block: patch_cells(source, prep, site, config.cells, det) for site in found}}

    sweep = run_sweep(source, config, detection, progress, visit)
    return sweep.result(PatchingResult, source, config, "patched")
