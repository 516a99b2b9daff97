"""LOST object discovery (Simeoni et al. 2021; docs/methods.md section 5) and its CorLoc score.

Arithmetic of the reference code (``valeoai/LOST`` ``object_discovery.py``, commit c0ff67ba3baf, functions
``lost``, ``patch_scoring``, ``detect_box``), per image:

1. F [P, D]: the keys of one block (``blocks.N.attn.hook_k``, heads concatenated), patch tokens only (CLS,
   trained registers and test-time registers excluded). A = F F^T [P, P].
2. degree[p] = number of q != p with A[p, q] > 0 (the reference zeroes the diagonal, clips negatives to 0 and
   counts entries > 0, so the diagonal is NOT counted).
3. Patches sorted by degree, ascending; ties by patch index (``ties="index"``, a stable sort; the reference's
   ``torch.argsort`` is not stable, so its tie order is unspecified: ``ties="torch"`` makes the reference's call,
   whose order among ties depends on the device and torch build). seed = the first one.
4. Of the first k of that order, those q with A[seed, q] > 0 (the seed itself included) are "similar";
   M = sum of their rows of the unclipped A; mask = M > 0 on the [h, w] grid.
5. box = bounding box of the 4-connected component of the mask holding the seed, in cells [x0, y0, x1, y1]
   (end exclusive). The reference then scales by the patch size; here the cell box goes to input pixels and
   through the inverse of the model's resize/crop to original-image pixels (clipped to the image), where
   CorLoc compares it with the ground-truth boxes (IoU >= 0.5 with any of them, pixel-edge coordinates).
   ``protocol="lost"`` instead runs the reference's own input, box, ground-truth and IoU conventions
   (:mod:`interp.studies.objects.lost_protocol`: full-resolution images, one at a time).

When every degree is equal (e.g. DINOv2-S/14 at 224 px: every key correlates positively), the seed is a tie
broken by index: ``degenerate`` flags such images, and when every image is such a case the result's ``note``
says that the boxes are no discovery and what to try instead (:func:`degenerate_note`).

>>> result = lost_study(source, boxes="boxes.csv", progress=False)
>>> len(result.boxes), 0 <= result.corloc <= 1, result.ci_low <= result.corloc <= result.ci_high
(4, True, True)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ...errors import InterpError
from ...formats.box_files import checked_size, matched_entries, original_size, read_boxes
from ...formats.box_types import BoxTable, ImageBoxes
from ...models.inputs.geometry import input_geometry
from ...models.inputs.preprocessing import timm_transform
from .lost_core import (TIES, LostOutput, cells_to_input, corloc_hits, degree_order, degrees_of,  # noqa: F401
                        input_to_original, key_features, lost_one, seed_component)  # (re-exported)
from .configs import LostConfig
from .lost_protocol import (LOST_MEAN, LOST_STD, display_image, lost_box, lost_hits, lost_protocol_features,
                            lost_protocol_source, pos_table_options)
from .register_edit import study_edit
from ..core.stats import bootstrap_ci
from ..core.result import FIGURE_IMAGES, StudyResult
from ...runtime.passes import Fold, Reading, read_pass, run_readings
from ...runtime.source import ActivationSource, require_live
from ..declaration import study
from ...hooks.names import resolve_block


# What LOST was published on (Simeoni et al. 2021): the keys of the last block of DINO ViT-S/16.
PUBLISHED_SETTING = "DINO ViT-S/16 (e.g. timm vit_small_patch16_224.dino), keys of the last block"


def degenerate_note(degenerate: Sequence[bool], box_cells: Sequence[Sequence[int]], grid: Sequence[int],
                    layer: int, grids: Optional[Sequence[Sequence[int]]] = None) -> Optional[str]:
    """What tied seeds mean and what to try: a sentence when every image is degenerate (all degrees equal),
    a shorter one when some are, None when none is. ``grids``: per image (h, w), when they differ."""
    n, tied = len(degenerate), sum(bool(d) for d in degenerate)
    if tied == 0:
        return None
    if tied < n:
        return (f"{tied} of {n} images have all degrees equal: their seed is the first patch by index (a tie, "
                "not a discovery) and their box is no object.")
    grids = grids if grids is not None else [grid] * n
    whole = all(list(b) == [0, 0, int(g[1]), int(g[0])] for b, g in zip(box_cells, grids))
    return (f"degenerate: on every image ({tied} of {n}) every key of block {layer} correlates positively with "
            "every other, so all degrees are equal, the seed is the first patch by index"
            + (" and the box is the whole image" if whole else "") + ": LOST finds no object here. Try the keys "
            "of another block (interp study lost --layer N; lost_study(layer=N)), or the model family LOST was "
            f"published on: {PUBLISHED_SETTING}.")


@dataclass
class LostResult(StudyResult):
    """Result of :func:`lost_study`.

    Attributes:
        hook: the key hook read; k: lowest-degree patches considered at seed expansion.
        ids: image ids; seeds: per image the flat row-major seed patch index; degenerate: per image whether
            all degrees were equal (the seed is then the lowest index, not a discovery).
        protocol: "model" (the model's transform) or "lost" (the reference's full-resolution images; ``grids``
            and ``image_sizes`` per image, ``grid`` empty); ties: how degree ties were ordered.
        box_cells: per image [x0, y0, x1, y1] on the patch grid (end exclusive).
        boxes_input: the same boxes in model-input pixels (protocol "lost": the padded image's).
        boxes: the same boxes in original-image pixels (None per image when its original size is unknown,
            e.g. a tensor of images).
        corloc, ci_low, ci_high: share of evaluated images whose box has IoU >= 0.5 with a ground-truth box,
            with a percentile bootstrap interval (None without ground truth); hits: per image (None: not
            evaluated, i.e. no ground-truth box listed); n_evaluated.
    """

    study = "lost"
    hook: str = ""
    k: int = 100
    protocol: str = "model"
    ties: str = "index"
    grid: List[int] = field(default_factory=list)
    grids: List[List[int]] = field(default_factory=list)  # protocol "lost": per image (h, w); grid is then []
    image_sizes: List[List[int]] = field(default_factory=list)  # protocol "lost": per image (width, height)
    patch_size: List[int] = field(default_factory=list)
    ids: List[str] = field(default_factory=list)
    seeds: List[int] = field(default_factory=list)
    degenerate: List[bool] = field(default_factory=list)
    box_cells: List[List[int]] = field(default_factory=list)
    boxes_input: List[List[float]] = field(default_factory=list)
    boxes: List[Optional[List[float]]] = field(default_factory=list)
    corloc: Optional[float] = None
    ci_low: Optional[float] = None
    ci_high: Optional[float] = None
    level: float = 0.95
    n_evaluated: int = 0
    hits: List[Optional[bool]] = field(default_factory=list)
    masks: List[List[List[int]]] = field(default_factory=list)
    n_registers: int = 0
    intervention: Optional[Dict[str, Any]] = None
    edited: Optional[Dict[str, Any]] = None
    note: Optional[str] = None  # what tied seeds mean and what to try (degenerate_note); None without ties

    @property
    def all_degenerate(self) -> bool:
        """Every image a tied seed: the boxes say nothing about objects (``note`` says what to try)."""
        return bool(self.degenerate) and all(self.degenerate)

    def summary(self) -> str:
        how = f"{self.hook}, k={self.k}" + (", LOST's protocol: full resolution" if self.protocol == "lost" else "")
        text = f"LOST on {len(self.ids)} images ({how}): " + _run_text(vars(self))
        if self.edited is not None:
            text += f"\nwith {self.intervention.get('kind', 'the intervention')}: " + _run_text(self.edited)
        return text + (f"\n{self.note}" if self.note else "")

    def figure_images(self, source) -> Any:
        """Under ``protocol="lost"`` the padded full-resolution images LOST saw; else the source's first images."""
        if self.protocol != "lost":
            return super().figure_images(source)
        ids = self.ids[:FIGURE_IMAGES]
        return [display_image(i, int(self.patch_size[0])) for i in ids] if ids else None


def _run_text(run: Dict[str, Any]) -> str:
    """One line for one LOST run (the fields of :data:`RUN_FIELDS`)."""
    text = f"{sum(run['degenerate'])} with all degrees equal (tied seed)"
    if run["corloc"] is not None:
        text += (f"; CorLoc {100 * run['corloc']:.1f} % [{100 * run['ci_low']:.1f}, {100 * run['ci_high']:.1f}] "
                 f"on {run['n_evaluated']} images")
    return text


# the per-run fields of a LostResult; ``edited`` holds the same keys for the run under the intervention
RUN_FIELDS = ("seeds", "degenerate", "box_cells", "boxes_input", "boxes", "masks", "corloc", "ci_low", "ci_high",
              "n_evaluated", "hits")


def _original_boxes(source: ActivationSource, box_inputs: List[List[float]],
                    entries: Optional[List[Optional[ImageBoxes]]]) -> List[Optional[List[float]]]:
    """Input-pixel boxes -> original pixels through the inverse of the source's transform (None when the
    original size is unknown and there is no ground truth asking for it)."""
    entries = entries if entries is not None else [None] * len(source.ids)
    try:
        transform = timm_transform(source.data_config())
    except InterpError:
        if any(e is not None for e in entries):
            raise
        return [None] * len(box_inputs)
    out: List[Optional[List[float]]] = []
    for image_id, entry, box in zip(source.ids, entries, box_inputs):
        if entry is None and not Path(image_id).is_file():
            out.append(None)
            continue
        out.append(input_to_original(box, input_geometry(transform, original_size(image_id, entry))))
    return out


def _ground_truth(ids: Sequence[str], entries: List[Optional[ImageBoxes]]) -> List[List[List[float]]]:
    """Per image its ground-truth boxes (original pixels; [] when it has none), each checked to lie on its image
    (:func:`~interp.formats.box_files.checked_size`, as PiB checks them)."""
    out = []
    for image_id, entry in zip(ids, entries):
        if entry is not None and entry.boxes:
            checked_size(image_id, entry)
        out.append([b.as_list() for b in entry.boxes] if entry is not None else [])
    return out


def _lost_fold(source: ActivationSource, hook: str, k: int, outputs: List[LostOutput], ties: str) -> Fold:
    """A fold appending LOST's output for every image of each batch to ``outputs``."""
    grid = tuple(source.layout_of(hook).grid)

    def fold(batch) -> None:
        outputs.extend(lost_one(f, grid, k, ties) for f in key_features(batch.acts[hook], batch.layout_of(hook)))

    return Fold([hook], fold)


def _lost_outputs(source: ActivationSource, hook: str, k: int, batch_size: int, desc: str,
                  progress: bool, ties: str) -> List[LostOutput]:
    """LOST on every image of the source (under a live source's interventions)."""
    outputs: List[LostOutput] = []
    read_pass(source, [_lost_fold(source, hook, k, outputs, ties)], batch_size, progress, desc)
    return outputs


def _run_fields(outputs: List[LostOutput], boxes_input, boxes_original, hits: List[Optional[bool]], n_boot: int,
                level: float, seed: int) -> Dict[str, Any]:
    """The :data:`RUN_FIELDS` of one run from its outputs, boxes and per-image hits (CorLoc over the non-None)."""
    used = [h for h in hits if h is not None]
    corloc = low = high = None
    if used:
        corloc = sum(used) / len(used)
        low, high = bootstrap_ci(used, n_boot, level, seed)
    return {"seeds": [o.seed for o in outputs], "degenerate": [o.degenerate for o in outputs],
            "box_cells": [o.box_cells for o in outputs], "boxes_input": boxes_input, "boxes": boxes_original,
            "masks": [o.mask.int().tolist() for o in outputs], "corloc": corloc, "ci_low": low, "ci_high": high,
            "n_evaluated": len(used), "hits": hits}


def _score_run(source: ActivationSource, outputs: List[LostOutput], table: Optional[BoxTable], iou: float,
               n_boot: int, level: float, seed: int) -> Dict[str, Any]:
    """The :data:`RUN_FIELDS` of one run: boxes in input and original pixels, masks, CorLoc with ground truth."""
    boxes_input = [cells_to_input(o.box_cells, tuple(source.patch_size)) for o in outputs]
    entries = matched_entries(source.ids, table) if table is not None else None
    boxes_original = _original_boxes(source, boxes_input, entries)
    hits: List[Optional[bool]] = [None] * len(outputs)
    if entries is not None:
        hits = corloc_hits(boxes_original, _ground_truth(source.ids, entries), iou)
    return _run_fields(outputs, boxes_input, boxes_original, hits, n_boot, level, seed)


def _protocol_run(source: ActivationSource, hook: str, k: int, ties: str, table: Optional[BoxTable], iou: float,
                  n_boot: int, level: float, seed: int, progress: bool):
    """Protocol "lost": (the :data:`RUN_FIELDS`, per-image grids, per-image (width, height)) of one run over the
    image files at full resolution (:mod:`~interp.studies.objects.lost_protocol`)."""
    outputs, grids, sizes = [], [], []
    for features, grid, size in lost_protocol_features(source, hook, key_features, progress):
        outputs.append(lost_one(features, grid, k, ties))
        grids.append(list(grid))
        sizes.append(list(size))
    patch = int(source.patch_size[0])
    boxes_input = [cells_to_input(o.box_cells, (patch, patch)) for o in outputs]
    boxes = [lost_box(o.box_cells, patch, tuple(size)) for o, size in zip(outputs, sizes)]
    hits: List[Optional[bool]] = [None] * len(outputs)
    if table is not None:
        hits = lost_hits(boxes, _ground_truth(source.ids, matched_entries(source.ids, table)), iou)
    return _run_fields(outputs, boxes_input, boxes, hits, n_boot, level, seed), grids, sizes


def _lost_protocol_study(source: ActivationSource, layer: int, k: int, table: Optional[BoxTable], intervention,
                         iou: float, n_boot: int, level: float, seed: int, ties: str, progress: bool) -> LostResult:
    """:func:`lost_study` with ``protocol="lost"``."""
    source = lost_protocol_source(source)
    layer, hook = _key_hook(source, layer, k)
    if table is not None:  # impossible boxes and a box file for other images refused before the model runs
        _ground_truth(source.ids, matched_entries(source.ids, table))
    base, grids, sizes = _protocol_run(source, hook, k, ties, table, iou, n_boot, level, seed, progress)
    params = {"layer": layer, "k": k, "iou": iou, "n_boot": n_boot, "level": level, "boxes": table is not None,
              "intervention": None, "protocol": "lost", "ties": ties, "mean": list(LOST_MEAN), "std": list(LOST_STD),
              "pos_table": pos_table_options(source)}
    result = LostResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=seed, hook=hook, k=k,
        protocol="lost", ties=ties, grid=[], grids=grids, image_sizes=sizes, patch_size=list(source.patch_size),
        ids=list(source.ids), level=level, n_registers=int(source.layout.n_registers), intervention=None,
        edited=None, note=degenerate_note(base["degenerate"], base["box_cells"], [], layer, grids), **base)
    if intervention is not None:
        result.edited = _protocol_run(source.with_interventions(intervention), hook, k, ties, table, iou, n_boot,
                                      level, seed, progress)[0]
        result.intervention = result.params["intervention"] = {"kind": intervention.kind, **intervention.params()}
    return result


def _key_hook(source: ActivationSource, layer: int, k: int) -> Tuple[int, str]:
    """(block, its key hook) for LOST on ``source``, checked: k >= 1, the hook recorded, full key vectors."""
    if k < 1:
        raise InterpError(f"k must be >= 1, got {k}")
    layer = resolve_block(layer, source.n_layers)
    hook = source.blocks.attn_k(layer)
    source.require([hook])
    if source.norms_only:
        raise InterpError("this cache stores token norms only; LOST needs the key vectors: write the cache "
                          "without --norms-only")
    return layer, hook


def refuse_pyramid(source: ActivationSource) -> None:
    """Raise :class:`~interp.errors.InterpError` for a pyramid model (a layout with stage grids)."""
    if source.layout.stage_grids:
        raise InterpError(f"LOST is not defined for the pyramid model {source.model_name}: its seed is the patch "
                          "with the fewest positive key correlations over one grid of patch keys (a plain ViT's), "
                          "while a pyramid's keys are reduced (PVTv2) or windowed (Swin) on stages of other grids")


@study(LostConfig)
def lost_study(source: ActivationSource, config: LostConfig, *, intervention=None,
               progress: bool = True) -> LostResult:
    """LOST boxes for every image of a source (live or cache with ``blocks.{layer}.attn.hook_k``), and CorLoc
    when ground-truth ``boxes`` (a box file or table, original pixels; :mod:`interp.formats.box_files`) are given.

    Args:
        config: the options (:class:`~interp.studies.objects.configs.LostConfig`; or pass them as keywords):
            ``layer`` the block whose keys are used (negative counts from the end; default the last); ``k`` the
            lowest-degree patches considered at seed expansion (reference: 100); ``boxes`` the ground truth;
            ``iou`` CorLoc's IoU threshold; ``n_boot``, ``level``, ``seed`` its bootstrap interval;
            ``protocol`` ``"model"`` (default: the images through the source's transform, batched) or
            ``"lost"`` (the reference's own, :mod:`~interp.studies.objects.lost_protocol`: each image file at full
            resolution, padded to the patch size, the position table resampled per image as DINO does, a box
            file path read with LOST's ground-truth conventions (COCO crowd boxes dropped, corners rounded),
            LOST's IoU; needs a live source over image files with no ``preprocess``); ``ties`` the order of
            patches of equal degree (:func:`degree_order`): ``"index"`` (default, reproducible) or ``"torch"``
            (the reference's unstable ``torch.argsort``); ``neurons`` (+ ``n_registers``): the register neurons
            of a test-time register LOST also runs with.
        intervention: an edit instead of ``neurons`` (e.g. a ``TestTimeRegister``; live source only): LOST runs
            once without and once with it; the edited run's fields (:data:`RUN_FIELDS`) go to ``result.edited``
            (Darcet Table 3).
    """
    c = config
    layer, k, boxes, iou, n_boot, level, seed, ties = c.layer, c.k, c.boxes, c.iou, c.n_boot, c.level, c.seed, c.ties
    refuse_pyramid(source)
    intervention = study_edit(c.neurons, c.n_registers, intervention)
    if c.protocol == "lost":
        table = read_boxes(boxes, convention="lost") if isinstance(boxes, (str, Path)) else boxes
        return _lost_protocol_study(source, layer, k, table, intervention, iou, n_boot, level, seed, ties, progress)
    table = read_boxes(boxes) if isinstance(boxes, (str, Path)) else boxes
    reading = lost_reading(source, layer, k, table, iou=iou, n_boot=n_boot, level=level, seed=seed, ties=ties)
    if intervention is not None:
        require_live(source, "LOST with an intervention")
    bs = source.batch_size
    result = run_readings(source, [reading], bs, progress, "LOST")[0]
    if intervention is not None:
        outputs = _lost_outputs(source.with_interventions(intervention), result.hook, k, bs, "LOST (edited)",
                                progress, ties)
        result.edited = _score_run(source, outputs, table=table, iou=iou, n_boot=n_boot, level=level, seed=seed)
        result.intervention = result.params["intervention"] = {"kind": intervention.kind, **intervention.params()}
    return result


def lost_reading(source: ActivationSource, layer: int = -1, k: int = 100,
                 boxes: Union[BoxTable, str, Path, None] = None, *, iou: float = 0.5, n_boot: int = 1000,
                 level: float = 0.95, seed: int = 0, ties: str = "index") -> Reading:
    """:func:`lost_study` without an intervention, around its pass: the fold that runs LOST on each batch's
    keys, then the :class:`LostResult` (for a shared pass, :mod:`interp.runtime.passes`)."""
    refuse_pyramid(source)
    layer, hook = _key_hook(source, layer, k)
    table = read_boxes(boxes) if isinstance(boxes, (str, Path)) else boxes
    if table is not None:  # impossible boxes and a box file for other images refused before the pass
        _ground_truth(source.ids, matched_entries(source.ids, table))
    outputs: List[LostOutput] = []

    def finish() -> LostResult:
        base = _score_run(source, outputs, table=table, iou=iou, n_boot=n_boot, level=level, seed=seed)
        params = {"layer": layer, "k": k, "iou": iou, "n_boot": n_boot, "level": level,
                  "boxes": table is not None, "intervention": None, "protocol": "model", "ties": ties}
        return LostResult(
            model=source.model_name, fingerprint=source.fingerprint, params=params, seed=seed, hook=hook, k=k,
            ties=ties, grid=list(source.layout.grid), patch_size=list(source.patch_size), ids=list(source.ids),
            level=level, n_registers=int(source.layout.n_registers), intervention=None, edited=None,
            note=degenerate_note(base["degenerate"], base["box_cells"], source.layout.grid, layer), **base)

    return Reading([_lost_fold(source, hook, k, outputs, ties)], finish)
