"""Patch Score (docs/methods.md section 3): ``S_p = cos(x_p, g)`` between each patch token and a global vector.

The patch tokens come from ``hook`` (default ``hook_norm_final``, the final normed tokens; or any
``blocks.{i}.hook_resid_post``). The global vector ``g`` is chosen by ``reference``:

* ``"cls"``: the raw CLS output, i.e. the CLS row of ``hook_norm_final``;
* ``"pooled"``: the vector the head sees (``hook_pooled``); it must have the tokens' width;
* ``"selective"``: selective aggregation (``interp.interventions.selective_aggregation.selective_aggregate``) of the
  final normed patch tokens, with the parameters of a :class:`SelectiveCLS` object.

Distributions (all patches, and foreground / background cells when regions are given) are of the raw
cosines, or with ``normalise="minmax"`` of each image's map rescaled to [0, 1] (so images with different
score ranges weigh alike). Which cells are foreground is the regions' rule (``cell_rule`` of
:func:`~interp.studies.core.regions.regions_from_boxes`: a cell the box touches, or ``"majority"``: most of
the cell's area inside the box).

>>> from interp.models import data_config
>>> from interp.formats.box_files import read_boxes
>>> from interp.studies.core.regions import regions_from_boxes
>>> regions = regions_from_boxes(source.ids, read_boxes("boxes.csv"), data_config(model), model.layout.grid)
>>> result = patch_score_study(source, reference="cls", regions=regions, progress=False)   # or boxes="boxes.csv"
>>> len(result.maps), len(result.maps[0]), len(result.maps[0][0])      # [N][h][w] cosines
(4, 14, 14)
>>> -1 <= result.bg.mean <= 1 and -1 <= result.fg.mean <= 1           # mean score off / on the boxes
True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ...errors import InterpError
from ...interventions.selective_cls import SelectiveCLS
from ...runtime.source import ActivationSource
from ..core.regions import Regions, cell_size, regions_from_masks
from ..core.result import StudyResult
from ..core.score_maps import FINAL, compute_score_maps
from ..declaration import study
from .configs import PatchScoreConfig
from .pib import load_regions

NORMALISATIONS = ("none", "minmax")
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


# ---------------------------------------------------------------------------------------------- distributions
@dataclass
class ScoreDistribution:
    """Summary of a set of Patch Scores: count, mean, std, quantiles and a histogram on fixed edges.

    Attributes:
        quantiles: {"q05": ..., "q25": ..., "q50": ..., "q75": ..., "q95": ...} (None when empty).
        counts: histogram counts over ``edges`` (len(edges) - 1 bins over [-1, 1]).
    """

    n: int
    mean: Optional[float]
    std: Optional[float]
    quantiles: Dict[str, Optional[float]]
    counts: List[int]
    edges: List[float]

    @classmethod
    def of(cls, values: torch.Tensor, bins: int = 40) -> "ScoreDistribution":
        v = values.detach().float().reshape(-1).cpu().numpy()
        edges = np.linspace(-1.0, 1.0, bins + 1)
        counts, _ = np.histogram(np.clip(v, -1.0, 1.0), bins=edges)
        empty = v.size == 0
        return cls(
            n=int(v.size),
            mean=None if empty else float(v.mean()),
            std=None if empty else float(v.std()),
            quantiles={f"q{int(round(q * 100)):02d}": None if empty else float(np.quantile(v, q)) for q in QUANTILES},
            counts=counts.tolist(),
            edges=edges.tolist(),
        )

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> Optional["ScoreDistribution"]:
        return None if d is None else (d if isinstance(d, cls) else cls(**d))


def normalise_maps(maps: torch.Tensor, normalise: str = "none") -> torch.Tensor:
    """Score maps [N, h, w] as the distributions use them: ``"none"`` as they are; ``"minmax"`` each image's map
    rescaled to [0, 1], ``(S - min S) / (max S - min S)`` (a constant map becomes all 0)."""
    if normalise not in NORMALISATIONS:
        raise InterpError(f"normalise={normalise!r} is not one of {list(NORMALISATIONS)}")
    if normalise == "none" or maps.numel() == 0:
        return maps
    flat = maps.flatten(1)
    low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    span = high - low
    scaled = torch.where(span > 0, (flat - low) / torch.where(span > 0, span, torch.ones_like(span)),
                         torch.zeros_like(flat))
    return scaled.view_as(maps)


def fg_bg_distributions(maps: torch.Tensor, regions: Regions, bins: int = 40) -> Tuple[ScoreDistribution,
                                                                                    ScoreDistribution]:
    """Scores of inside (foreground) and outside (background) cells, over the images with a region."""
    usable = regions.usable
    inside = regions.inside[usable]
    kept = maps[usable]
    return ScoreDistribution.of(kept[inside], bins), ScoreDistribution.of(kept[~inside], bins)


# ---------------------------------------------------------------------------------------------- study
@dataclass
class PatchScoreResult(StudyResult):
    """Result of :func:`patch_score_study`.

    Attributes:
        ids: image ids, in order.
        hook, reference: where the patch tokens come from, and the global vector (``cls``/``pooled``/``selective``).
        selective: SelectiveCLS parameters (reference ``selective`` only).
        grid: patch grid [h, w]; patch_size: [ph, pw] in input pixels.
        maps: [N][h][w] Patch Scores.
        top_patch: per image the flat index (row-major) of the highest-score patch.
        scores: distribution of all Patch Scores.
        fg, bg: distributions inside / outside the regions (None without regions).
        boxes_input: per image the region boxes in input pixels [[x0, y0, x1, y1], ...] (empty without boxes).
        excluded: images without a usable region, by reason (empty without regions).
        normalise: "none" or "minmax" (each image's map rescaled to [0, 1] before the distributions; ``maps``
            stay the raw cosines).
        cell_rule: how the regions' cells were decided ("touch" or "majority"; None without regions).
    """

    study = "patch_score"
    ids: List[str] = field(default_factory=list)
    hook: str = FINAL
    reference: str = "cls"
    selective: Optional[Dict] = None
    grid: List[int] = field(default_factory=list)
    patch_size: List[int] = field(default_factory=list)
    maps: List = field(default_factory=list)
    top_patch: List[int] = field(default_factory=list)
    scores: Optional[ScoreDistribution] = None
    fg: Optional[ScoreDistribution] = None
    bg: Optional[ScoreDistribution] = None
    boxes_input: List = field(default_factory=list)
    excluded: Dict[str, int] = field(default_factory=dict)
    normalise: str = "none"
    cell_rule: Optional[str] = None

    def __post_init__(self):
        self.scores = ScoreDistribution.from_dict(self.scores)
        self.fg = ScoreDistribution.from_dict(self.fg)
        self.bg = ScoreDistribution.from_dict(self.bg)

    def console_lines(self, config=None) -> List[str]:
        """The foreground and background means (nothing without regions)."""
        if self.fg is None:
            return []
        return [f"Patch Score ({self.reference}): foreground mean {self.fg.mean}, background mean {self.bg.mean}; "
                f"excluded {self.excluded}"]

    def maps_tensor(self) -> torch.Tensor:
        """The score maps as a Tensor [N, h, w]."""
        return torch.as_tensor(np.asarray(self.maps, dtype=np.float32)).reshape(-1, *self.grid)


def config_regions(source: ActivationSource, config: PatchScoreConfig) -> Optional[Regions]:
    """The regions ``config`` asks for (``boxes`` with its filters, or ``masks``), None without either."""
    if config.boxes:
        return load_regions(source, config.boxes, config.single_object, config.max_box_fraction, config.cell_rule)
    if config.masks:
        return regions_from_masks(source.ids, config.masks, source.data_config(), tuple(source.layout.grid),
                                  config.cell_rule)
    return None


@study(PatchScoreConfig)
def patch_score_study(source: ActivationSource, config: PatchScoreConfig, *,
                      selective: Optional[SelectiveCLS] = None, regions: Optional[Regions] = None,
                      progress: bool = True) -> PatchScoreResult:
    """Patch Score maps of every image, with foreground/background distributions when regions are given.

    Args:
        source: a live source or a cache holding ``hook`` and ``hook_norm_final`` (``hook_pooled`` for
            reference ``pooled``), all token rows.
        config: the options (:class:`~interp.studies.aggregation.configs.PatchScoreConfig`; or pass them as
            keywords, a group's flat): ``patch_score``
            (:class:`~interp.studies.aggregation.configs.PatchScoreSettings`): ``hook`` the patch tokens
            (``hook_norm_final`` or ``blocks.{i}.hook_resid_post``), ``reference`` ``cls``, ``pooled`` or
            ``selective`` (module docstring), ``selective_k``, ``sigma``, ``score``, ``fft``, ``eps`` the
            SelectiveCLS of the ``selective`` vector; ``boxes`` (a box file or
            table, filtered by ``single_object`` and ``max_box_fraction``) or ``masks`` (a folder) for the
            foreground cells, decided by ``cell_rule``; ``bins`` histogram bins over [-1, 1]; ``normalise``
            ``"none"`` (default) or ``"minmax"``: the distributions of each image's map rescaled to [0, 1].
        selective: a SelectiveCLS whose parameters (k, sigma, score, fft, eps) define the ``selective`` vector
            (default: the config's).
        regions: foreground cells per image (:func:`~interp.studies.core.regions.regions_from_boxes` or
            :func:`~interp.studies.core.regions.regions_from_masks`), in the source's image order, instead of
            the config's ``boxes`` / ``masks``.
        progress: show progress bars.
    """
    c = config
    if regions is not None and (c.boxes or c.masks):
        raise InterpError("give regions= or the boxes / masks options, not both")
    if regions is not None and regions.inside.shape[0] != len(source):
        raise InterpError(f"regions cover {regions.inside.shape[0]} images but the source has {len(source)}")
    score = c.patch_score
    normalise_maps(torch.zeros(0), c.normalise)  # a bad option is refused before the pass
    regions = regions if regions is not None else config_regions(source, c)
    selective = selective or SelectiveCLS(**score.selective_params())
    maps = compute_score_maps(source, score.hook, score.reference, selective, None, progress)
    values = normalise_maps(maps, c.normalise)
    fg = bg = None
    if regions is not None:
        fg, bg = fg_bg_distributions(values, regions, c.bins)
    selective_params = selective.params() if score.reference == "selective" else None
    cell_rule = regions.cell_rule if regions is not None else None
    params = {"hook": score.hook, "reference": score.reference, "selective": selective_params, "bins": c.bins,
              "regions": regions is not None, "normalise": c.normalise, "cell_rule": cell_rule}
    return PatchScoreResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None,
        ids=list(source.ids), hook=score.hook, reference=score.reference, selective=selective_params,
        grid=list(source.layout.grid), patch_size=list(cell_size(source)),
        maps=maps.tolist(), top_patch=maps.flatten(1).argmax(1).tolist() if len(maps) else [],
        scores=ScoreDistribution.of(values, c.bins), fg=fg, bg=bg,
        boxes_input=regions.boxes_input if regions is not None else [],
        excluded=regions.excluded_counts() if regions is not None else {}, normalise=c.normalise,
        cell_rule=cell_rule,
    )
