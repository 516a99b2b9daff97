"""LOST object discovery (Simeoni et al. 2021; docs/methods.md section 5) and its CorLoc score.

Arithmetic of the reference code (``valeoai/LOST`` ``object_discovery.py``, commit c0ff67ba3baf, functions
``lost``, ``patch_scoring``, ``detect_box``), per image:

1. F [P, D]: the keys of one block (``blocks.N.attn.hook_k``, heads concatenated), patch tokens only (CLS,
   trained registers and test-time registers excluded). A = F F^T [P, P].
2. degree[p] = number of q != p with A[p, q] > 0 (the reference zeroes the diagonal, clips negatives to 0 and
   counts entries > 0, so the diagonal is NOT counted).
3. Patches sorted by degree, ascending; ties by patch index (a stable sort; the reference's ``torch.argsort``
   is not stable, so its tie order is unspecified). seed = the first one.
4. Of the first k of that order, those q with A[seed, q] > 0 (the seed itself included) are "similar";
   M = sum of their rows of the unclipped A; mask = M > 0 on the [h, w] grid.
5. box = bounding box of the 4-connected component of the mask holding the seed, in cells [x0, y0, x1, y1]
   (end exclusive). The reference then scales by the patch size; here the cell box goes to input pixels and
   through the inverse of the model's resize/crop to original-image pixels (clipped to the image), where
   CorLoc compares it with the ground-truth boxes (IoU >= 0.5 with any of them, pixel-edge coordinates).

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

import torch

from ...errors import InterpError
from ...hooks.names import attn_k
from .boxes import BoxTable, InputGeometry, eval_transform, input_geometry, match_boxes, original_size, read_boxes
from ..core.metrics import box_iou
from ..core.outliers import resolve_layer
from ..aggregation.patch_score import split_tokens
from ..aggregation.pib import bootstrap_ci
from ..core.result import StudyResult
from ..core.passes import Reader, Reading, read_pass, run_readings
from ..core.source import ActivationSource, live_model


# What LOST was published on (Simeoni et al. 2021): the keys of the last block of DINO ViT-S/16.
PUBLISHED_SETTING = "DINO ViT-S/16 (e.g. timm vit_small_patch16_224.dino), keys of the last block"


def degenerate_note(degenerate: Sequence[bool], box_cells: Sequence[Sequence[int]], grid: Sequence[int],
                    layer: int) -> Optional[str]:
    """What tied seeds mean and what to try: a sentence when every image is degenerate (all degrees equal),
    a shorter one when some are, None when none is."""
    n, tied = len(degenerate), sum(bool(d) for d in degenerate)
    if tied == 0:
        return None
    if tied < n:
        return (f"{tied} of {n} images have all degrees equal: their seed is the first patch by index (a tie, "
                "not a discovery) and their box is no object.")
    whole = all(list(b) == [0, 0, int(grid[1]), int(grid[0])] for b in box_cells)
    return (f"degenerate: on every image ({tied} of {n}) every key of block {layer} correlates positively with "
            "every other, so all degrees are equal, the seed is the first patch by index"
            + (" and the box is the whole image" if whole else "") + ": LOST finds no object here. Try the keys "
            "of another block (interp study lost --layer N; lost_study(layer=N)), or the model family LOST was "
            f"published on: {PUBLISHED_SETTING}.")


@dataclass
class LostOutput:
    """LOST on one image: seed (flat row-major patch index), degrees [P], mask [h, w] bool (M > 0),
    component [h, w] bool (the seed's 4-connected part), box_cells [x0, y0, x1, y1] (end exclusive)."""

    seed: int
    degrees: torch.Tensor
    mask: torch.Tensor
    component: torch.Tensor
    box_cells: List[int]
    degenerate: bool


def key_features(keys: torch.Tensor, layout) -> torch.Tensor:
    """Patch rows of ``hook_k`` [b, t, h, dh] (or [b, t, h*dh]), heads concatenated -> [b, P, h*dh]."""
    flat = keys.reshape(keys.shape[0], keys.shape[1], -1)
    _, patches = split_tokens(flat, layout)
    return patches


def degrees_of(affinity: torch.Tensor) -> torch.Tensor:
    """Number of positive off-diagonal entries per row of a [P, P] affinity -> [P] long."""
    off_diagonal = ~torch.eye(affinity.shape[0], dtype=torch.bool, device=affinity.device)
    return ((affinity > 0) & off_diagonal).sum(1)


def seed_component(mask: torch.Tensor, seed_rc: Tuple[int, int]) -> torch.Tensor:
    """The 4-connected component of ``mask`` [h, w] bool that holds ``seed_rc`` (empty if it is off the mask).

    Grown by repeated 4-neighbour dilation restricted to the mask, until it stops changing."""
    comp = torch.zeros_like(mask)
    if not mask[seed_rc]:
        return comp
    comp[seed_rc] = True
    while True:
        grown = comp.clone()
        grown[1:] |= comp[:-1]
        grown[:-1] |= comp[1:]
        grown[:, 1:] |= comp[:, :-1]
        grown[:, :-1] |= comp[:, 1:]
        grown &= mask
        if torch.equal(grown, comp):
            return comp
        comp = grown


def lost_one(features: torch.Tensor, grid: Tuple[int, int], k: int = 100) -> LostOutput:
    """LOST on one image's patch features [P, D] on a grid (h, w) with P = h * w (module docstring, steps 1-5)."""
    h, w = grid
    if features.shape[0] != h * w:
        raise InterpError(f"{features.shape[0]} patch features do not fill the {h}x{w} grid")
    feats = features.double()
    affinity = feats @ feats.T
    degrees = degrees_of(affinity)
    order = torch.sort(degrees, stable=True).indices
    seed = int(order[0])
    candidates = order[:k]
    similar = candidates[affinity[seed, candidates] > 0]
    mask = (affinity[similar].sum(0) > 0).reshape(h, w)
    component = seed_component(mask, divmod(seed, w))
    if not component.any():  # the seed row has A[seed, seed] = |f|^2 > 0, so only a zero feature gets here
        raise InterpError(f"LOST: the seed patch {seed} is not in the mask (an all-zero key vector?)")
    rows, cols = component.nonzero(as_tuple=True)
    box = [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]
    return LostOutput(seed, degrees, mask, component, box, bool(degrees.min() == degrees.max()))


def cells_to_input(box_cells: Sequence[int], patch_size: Tuple[int, int]) -> List[float]:
    """A cell box [x0, y0, x1, y1] (end exclusive) -> input pixels, pixel-edge coordinates."""
    ph, pw = patch_size
    x0, y0, x1, y1 = box_cells
    return [float(x0 * pw), float(y0 * ph), float(x1 * pw), float(y1 * ph)]


def input_to_original(box: Sequence[float], geometry: InputGeometry) -> List[float]:
    """Inverse of :meth:`InputGeometry.to_input`: an input-pixel box -> original pixels, clipped to the image."""
    width, height = geometry.image_size
    x0, y0, x1, y1 = box
    fx = [min(max((u - geometry.offset_x) / geometry.scale_x, 0.0), float(width)) for u in (x0, x1)]
    fy = [min(max((v - geometry.offset_y) / geometry.scale_y, 0.0), float(height)) for v in (y0, y1)]
    return [fx[0], fy[0], fx[1], fy[1]]


def corloc_hits(pred: Sequence[Optional[Sequence[float]]], gt: Sequence[Sequence[Sequence[float]]],
                iou: float = 0.5) -> List[Optional[bool]]:
    """Per image: does the predicted box reach IoU >= ``iou`` with any ground-truth box? None when the image
    has no ground-truth box or no predicted box (it is left out of CorLoc)."""
    def hit(p, g) -> bool:
        v = box_iou(p, g)  # None (two zero-area boxes) is no hit
        return v is not None and v >= iou

    return [None if p is None or not boxes else any(hit(p, g) for g in boxes) for p, boxes in zip(pred, gt)]


@dataclass
class LostResult(StudyResult):
    """Result of :func:`lost_study`.

    Attributes:
        hook: the key hook read; k: lowest-degree patches considered at seed expansion.
        ids: image ids; seeds: per image the flat row-major seed patch index; degenerate: per image whether
            all degrees were equal (the seed is then the lowest index, not a discovery).
        box_cells: per image [x0, y0, x1, y1] on the patch grid (end exclusive).
        boxes_input: the same boxes in model-input pixels.
        boxes: the same boxes in original-image pixels (None per image when its original size is unknown,
            e.g. a tensor of images).
        corloc, ci_low, ci_high: share of evaluated images whose box has IoU >= 0.5 with a ground-truth box,
            with a percentile bootstrap interval (None without ground truth); hits: per image (None: not
            evaluated, i.e. no ground-truth box listed); n_evaluated.
    """

    study = "lost"
    hook: str = ""
    k: int = 100
    grid: List[int] = field(default_factory=list)
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
        text = f"LOST on {len(self.ids)} images ({self.hook}, k={self.k}): " + _run_text(vars(self))
        if self.edited is not None:
            text += f"\nwith {self.intervention.get('kind', 'the intervention')}: " + _run_text(self.edited)
        return text + (f"\n{self.note}" if self.note else "")


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
                    table: Optional[BoxTable]) -> List[Optional[List[float]]]:
    """Input-pixel boxes -> original pixels through the inverse of the source's transform (None when the
    original size is unknown and there is no ground truth asking for it)."""
    entries = match_boxes(source.ids, table) if table else [None] * len(source.ids)
    try:
        transform = eval_transform(source.data_config())
    except InterpError:
        if table:
            raise
        return [None] * len(box_inputs)
    out: List[Optional[List[float]]] = []
    for image_id, entry, box in zip(source.ids, entries, box_inputs):
        if entry is None and not Path(image_id).is_file():
            out.append(None)
            continue
        out.append(input_to_original(box, input_geometry(transform, original_size(image_id, entry))))
    return out


def _lost_reader(source: ActivationSource, hook: str, k: int, outputs: List[LostOutput]) -> Reader:
    """A reader appending LOST's output for every image of each batch to ``outputs``."""
    grid = tuple(source.layout.grid)

    def fold(batch) -> None:
        outputs.extend(lost_one(f, grid, k) for f in key_features(batch.acts[hook], batch.layout))

    return Reader([hook], fold)


def _lost_outputs(source: ActivationSource, hook: str, k: int, batch_size: int, desc: str,
                  progress: bool) -> List[LostOutput]:
    """LOST on every image of the source (under a live source's interventions)."""
    outputs: List[LostOutput] = []
    read_pass(source, [_lost_reader(source, hook, k, outputs)], batch_size, progress, desc)
    return outputs


def _score_run(source: ActivationSource, outputs: List[LostOutput], table: Optional[BoxTable], iou: float,
               n_boot: int, level: float, seed: int) -> Dict[str, Any]:
    """The :data:`RUN_FIELDS` of one run: boxes in input and original pixels, masks, CorLoc with ground truth."""
    boxes_input = [cells_to_input(o.box_cells, tuple(source.patch_size)) for o in outputs]
    boxes_original = _original_boxes(source, boxes_input, table)
    hits: List[Optional[bool]] = [None] * len(outputs)
    corloc = low = high = None
    if table is not None:
        gt = [[b.as_list() for b in e.boxes] if e is not None else [] for e in match_boxes(source.ids, table)]
        hits = corloc_hits(boxes_original, gt, iou)
        used = [h for h in hits if h is not None]
        if used:
            corloc = sum(used) / len(used)
            low, high = bootstrap_ci(used, n_boot, level, seed)
    return {"seeds": [o.seed for o in outputs], "degenerate": [o.degenerate for o in outputs],
            "box_cells": [o.box_cells for o in outputs], "boxes_input": boxes_input, "boxes": boxes_original,
            "masks": [o.mask.int().tolist() for o in outputs], "corloc": corloc, "ci_low": low, "ci_high": high,
            "n_evaluated": sum(h is not None for h in hits), "hits": hits}


def lost_study(source: ActivationSource, layer: int = -1, k: int = 100,
               boxes: Union[BoxTable, str, Path, None] = None, *, intervention=None, iou: float = 0.5,
               n_boot: int = 1000, level: float = 0.95, seed: int = 0, batch_size: Optional[int] = None,
               progress: bool = True) -> LostResult:
    """LOST boxes for every image of a source (live or cache with ``blocks.{layer}.attn.hook_k``), and CorLoc
    when ground-truth ``boxes`` (a box file or table, original pixels; :mod:`interp.studies.objects.boxes`) are given.

    Args:
        layer: block whose keys are used (negative counts from the end; default the last).
        k: lowest-degree patches considered at seed expansion (reference: 100).
        intervention: an edit (e.g. a ``TestTimeRegister``; live source only): LOST runs once without and
            once with it; the edited run's fields (:data:`RUN_FIELDS`) go to ``result.edited`` (Darcet Table 3).
        iou: CorLoc's IoU threshold; n_boot, level, seed: its bootstrap interval.
    """
    table = read_boxes(boxes) if isinstance(boxes, (str, Path)) else boxes
    reading = lost_reading(source, layer, k, table, iou=iou, n_boot=n_boot, level=level, seed=seed)
    model = live_model(source, "LOST with an intervention") if intervention is not None else None
    bs = batch_size or source.batch_size
    result = run_readings(source, [reading], bs, progress, "LOST")[0]
    if model is not None:
        outputs = _lost_outputs(source.with_interventions(intervention), result.hook, k, bs, "LOST (edited)",
                                progress)
        result.edited = _score_run(source, outputs, table=table, iou=iou, n_boot=n_boot, level=level, seed=seed)
        result.intervention = result.params["intervention"] = {"kind": intervention.kind, **intervention.params()}
    return result


def lost_reading(source: ActivationSource, layer: int = -1, k: int = 100,
                 boxes: Union[BoxTable, str, Path, None] = None, *, iou: float = 0.5, n_boot: int = 1000,
                 level: float = 0.95, seed: int = 0) -> Reading:
    """:func:`lost_study` without an intervention, around its pass: the reader that runs LOST on each batch's
    keys, then the :class:`LostResult` (for a shared pass, :mod:`interp.studies.core.passes`)."""
    if k < 1:
        raise InterpError(f"k must be >= 1, got {k}")
    layer = resolve_layer(layer, source.n_layers)
    hook = attn_k(layer)
    source.require([hook])
    if source.norms_only:
        raise InterpError("this cache stores token norms only; LOST needs the key vectors: write the cache "
                          "without --norms-only")
    table = read_boxes(boxes) if isinstance(boxes, (str, Path)) else boxes
    outputs: List[LostOutput] = []

    def finish() -> LostResult:
        base = _score_run(source, outputs, table=table, iou=iou, n_boot=n_boot, level=level, seed=seed)
        params = {"layer": layer, "k": k, "iou": iou, "n_boot": n_boot, "level": level,
                  "boxes": table is not None, "intervention": None}
        return LostResult(
            model=source.model_name, fingerprint=source.fingerprint, params=params, seed=seed, hook=hook, k=k,
            grid=list(source.layout.grid), patch_size=list(source.patch_size), ids=list(source.ids),
            level=level, n_registers=int(source.layout.n_registers), intervention=None, edited=None,
            note=degenerate_note(base["degenerate"], base["box_cells"], source.layout.grid, layer), **base)

    return Reading([_lost_reader(source, hook, k, outputs)], finish)
