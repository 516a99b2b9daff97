"""PiB, "point in box" (docs/methods.md section 3): the share of images whose highest-Patch-Score patch lies in
the object's box, with a seeded bootstrap confidence interval.

Reference protocol: images with exactly one annotated box (``single_object``), boxes under 25 % of the
image area (``max_box_fraction``), each box mapped through the model's preprocessing onto the patch grid
(:mod:`interp.studies.core.regions`); a patch is inside when its cell touches the box.

>>> result = pib_study(source, boxes="boxes.csv", reference="cls", max_box_fraction=1, progress=False)
>>> result.ci_low <= result.pib <= result.ci_high, result.excluded     # images dropped per reason
(True, {'no_box': 0, 'several_boxes': 0, 'too_large': 0, 'cropped_away': 0})
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Union

import torch

from ...errors import InterpError, UsageError
from ...interventions.selective_cls import SelectiveCLS
from ...formats.box_files import matched_entries, original_size, read_boxes
from ...formats.box_types import BoxTable
from ..core.regions import Regions, cell_size, regions_from_boxes
from ..core.stats import bootstrap_ci
from ..core.score_maps import FINAL, compute_score_maps
from .pib_protocol import LAST_MAX_BOX_FRACTION, LAST_PREPROCESS, last_grid, last_regions
from ..core.result import StudyResult
from ..declaration import study
from .configs import PiBConfig
from ...runtime.live_source import LiveSource
from ...runtime.source import ActivationSource

PROTOCOLS = ("model", "last")


def pib_hits(maps: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """Whether each image's highest-score patch is inside its region. maps, inside [N, h, w] -> bool [N].

    Ties go to the first patch in row-major order (``argmax``)."""
    top = maps.flatten(1).argmax(1)
    return inside.flatten(1).gather(1, top[:, None])[:, 0]


@dataclass
class PiBSummary:
    """PiB over the usable images of one set of score maps.

    Attributes:
        hits: per image True/False, None for an excluded image.
    """

    pib: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    n_used: int
    hits: List[Optional[bool]]


def pib_from_maps(maps: torch.Tensor, regions: Regions, n_boot: int = 1000, level: float = 0.95,
                  seed: int = 0) -> PiBSummary:
    """PiB and its bootstrap interval from score maps [N, h, w] and regions of the same N images."""
    if maps.shape != regions.inside.shape:
        raise InterpError(f"score maps {tuple(maps.shape)} and regions {tuple(regions.inside.shape)} differ in shape")
    usable = regions.usable
    hits = pib_hits(maps, regions.inside)
    used = hits[usable].numpy()
    low, high = bootstrap_ci(used, n_boot, level, seed)
    per_image = [bool(h) if u else None for h, u in zip(hits.tolist(), usable.tolist())]
    pib = float(used.mean()) if used.size else None
    return PiBSummary(pib, None if used.size == 0 else low, None if used.size == 0 else high, int(used.size),
                      per_image)


@dataclass
class PiBResult(StudyResult):
    """Result of :func:`pib_study`.

    Attributes:
        pib: share of usable images whose top patch is inside the box (None when no image is usable).
        ci_low, ci_high: percentile bootstrap interval (``level``, ``n_boot`` resamples, ``seed``).
        n_images, n_used: images in the source / images that passed every filter.
        excluded: images left out by reason: no_box, several_boxes, too_large, cropped_away.
        ids, hits, top_patch: per image (hits None for excluded images; top_patch flat row-major index).
        boxes_input: per image the kept boxes in input pixels; grid [h, w]; patch_size [ph, pw].
        maps: [N][h][w] Patch Scores (empty when not stored).
    """

    study = "pib"
    pib: Optional[float] = None
    ci_low: Optional[float] = None
    ci_high: Optional[float] = None
    level: float = 0.95
    n_boot: int = 1000
    n_images: int = 0
    n_used: int = 0
    excluded: Dict[str, int] = field(default_factory=dict)
    hook: str = FINAL
    reference: str = "cls"
    ids: List[str] = field(default_factory=list)
    hits: List[Optional[bool]] = field(default_factory=list)
    top_patch: List[int] = field(default_factory=list)
    boxes_input: List = field(default_factory=list)
    grid: List[int] = field(default_factory=list)
    patch_size: List[int] = field(default_factory=list)
    maps: List = field(default_factory=list)

    def summary(self) -> str:
        if self.pib is None:
            return f"PiB: no usable image of {self.n_images} (excluded: {self.excluded})"
        return (f"PiB {100 * self.pib:.1f} % [{100 * self.ci_low:.1f}, {100 * self.ci_high:.1f}] "
                f"({100 * self.level:.0f} % bootstrap CI) on {self.n_used} of {self.n_images} images; "
                f"excluded: {self.excluded}")


def load_regions(source: ActivationSource, boxes: Union[BoxTable, str, Path], single_object: bool,
                 max_box_fraction: Optional[float], cell_rule: str = "touch") -> Regions:
    """Regions of the source's images from a box table or box file, through the source's preprocessing
    (``cell_rule``: :func:`~interp.studies.core.regions.box_cells`)."""
    table = read_boxes(boxes) if isinstance(boxes, (str, Path)) else boxes
    return regions_from_boxes(source.ids, table, source.data_config(), tuple(source.layout.grid),
                              single_object=single_object, max_box_fraction=max_box_fraction, cell_rule=cell_rule)


def last_protocol_source(source: LiveSource) -> LiveSource:
    """The live source over image files that feeds the model the LaSt reference's images (``Resize(256)`` +
    ``CenterCrop(224)``, bilinear, the model's mean/std: the eval transform ``LAST_PREPROCESS``); ids, labels and
    skips as ``source``."""
    if not isinstance(source, LiveSource) or source.ids and not source.reads_files:
        raise InterpError("protocol='last' re-reads the image files with the reference transform: give a live "
                          "source over image files (CLI --images DIR), not a cache or a tensor")
    if source.transform not in (None, LAST_PREPROCESS):
        raise InterpError(f"protocol='last' feeds the reference's {LAST_PREPROCESS.name} images; the source was "
                          f"opened with {source.transform.name}: leave --resize/--crop/--transform out")
    return source.with_preprocess(LAST_PREPROCESS)


def last_protocol_regions(source: ActivationSource, table: BoxTable) -> Regions:
    """Regions of the source's images under the ``last`` protocol (:mod:`interp.studies.aggregation.pib_protocol`): the
    reference's filters (one box, area < 25 %) and cells; the grid is ``224 // patch size``."""
    patch = int(source.patch_size[0])
    n = last_grid(patch)
    if tuple(source.layout.grid) != (n, n):
        raise InterpError(f"protocol='last' feeds 224 x 224 images; the model's grid is {tuple(source.layout.grid)}"
                          f", not {n} x {n}: load the model with img_size=224 (CLI --img-size 224)")
    entries = matched_entries(source.ids, table)
    boxes = [e.boxes if e is not None else None for e in entries]
    sizes = [original_size(i, e) if e is not None and e.boxes else (1, 1) for i, e in zip(source.ids, entries)]
    inside, reasons = last_regions(boxes, sizes, patch)
    return Regions(inside, reasons, [[] for _ in source.ids])


def protocol_regions(source: ActivationSource, boxes: Union[BoxTable, str, Path], protocol: str,
                     single_object: bool, max_box_fraction: Optional[float]):
    """(source, regions, single_object, max_box_fraction) as a PiB protocol uses them: ``"model"`` keeps the
    source and the filters given; ``"last"`` reads the source through :func:`last_protocol_source` and applies the
    reference's filters (one box, area < 25 %)."""
    if protocol not in PROTOCOLS:
        raise InterpError(f"protocol={protocol!r}: use one of {PROTOCOLS}")
    if protocol == "model":
        return source, load_regions(source, boxes, single_object, max_box_fraction), single_object, max_box_fraction
    source = last_protocol_source(source)
    table = read_boxes(boxes) if isinstance(boxes, (str, Path)) else boxes
    return source, last_protocol_regions(source, table), True, LAST_MAX_BOX_FRACTION


@study(PiBConfig)
def pib_study(source: ActivationSource, config: PiBConfig, *, selective: Optional[SelectiveCLS] = None,
              progress: bool = True) -> PiBResult:
    """PiB of a model (live or cached) on images with boxes.

    Args:
        source: live source over image files, or a cache of them (ids are the image paths).
        config: the options (:class:`~interp.studies.aggregation.configs.PiBConfig`; or pass them as keywords,
            a group's flat): ``objects``: ``boxes`` a box file (CSV / JSON / COCO, see
            :mod:`interp.formats.box_files`) or a table from ``read_boxes`` (required), ``single_object`` keep
            only images with exactly one box (reference protocol), ``max_box_fraction`` drop boxes larger than
            this share of the original image area (None: keep all), ``protocol`` ``"model"`` (default): the
            model's own transform and the filters above, ``"last"``: the LaSt reference exactly
            (``bbox_to_patch_set`` and its dataloader): Resize(256) + CenterCrop(224) whatever the model's crop,
            its box-to-cell arithmetic, one box per image, area strictly below 25 % (``single_object``/
            ``max_box_fraction`` are then the reference's); needs a live source over files and a model whose
            224-px grid is ``224 // patch``; ``boxes_input`` is left empty; ``patch_score``: ``reference``,
            ``hook``, ``selective_k``, ``sigma``, ``score``, ``fft``, ``eps`` the Patch Score
            (:mod:`interp.studies.aggregation.patch_score`); ``bootstrap``: ``n_boot``, ``level`` (and the
            config's ``seed``) the bootstrap interval; ``store_maps`` keep the [N, h, w] score maps in the result
            (for plots).
        selective: a SelectiveCLS whose parameters define the ``selective`` vector (default: the config's).
        progress: show progress bars.
    """
    c, objects, score, bootstrap = config, config.objects, config.patch_score, config.bootstrap
    if objects.boxes is None:
        raise UsageError("pib_study needs boxes= (CLI --boxes): a box file, CSV/JSON (image,x0,y0,x1,y1) or COCO "
                         "instances JSON, or a table from read_boxes")
    source, regions, single_object, max_box_fraction = protocol_regions(
        source, objects.boxes, objects.protocol, objects.single_object, objects.max_box_fraction)
    selective = selective or SelectiveCLS(**score.selective_params())
    maps = compute_score_maps(source, score.hook, score.reference, selective, None, progress)
    summary = pib_from_maps(maps, regions, bootstrap.n_boot, bootstrap.level, c.seed)
    params = {"protocol": objects.protocol, "reference": score.reference, "hook": score.hook,
              "single_object": single_object, "max_box_fraction": max_box_fraction, "n_boot": bootstrap.n_boot,
              "level": bootstrap.level, "selective": selective.params() if score.reference == "selective" else None}
    return PiBResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=c.seed,
        pib=summary.pib, ci_low=summary.ci_low, ci_high=summary.ci_high, level=bootstrap.level,
        n_boot=bootstrap.n_boot, n_images=len(source), n_used=summary.n_used, excluded=regions.excluded_counts(),
        hook=score.hook, reference=score.reference, ids=list(source.ids), hits=summary.hits,
        top_patch=maps.flatten(1).argmax(1).tolist() if len(maps) else [], boxes_input=regions.boxes_input,
        grid=list(source.layout.grid), patch_size=list(cell_size(source)),
        maps=maps.tolist() if c.store_maps else [],
    )
