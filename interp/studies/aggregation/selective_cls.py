"""The measured effect of ``SelectiveCLS`` applied to a frozen model (docs/methods.md section 3).

Rows: the baseline model (global vector = ``reference``: the CLS output, or the pooled vector), then the
model with ``SelectiveCLS(k=...)`` for each k (global vector = the selective aggregation of the final
normed patch tokens, which is what the head then sees). Columns:

``row, k, pib, pib_ci_low, pib_ci_high, fg_score_mean, bg_score_mean, top1_agreement, accuracy``

* PiB / CI and fg/bg Patch Score means over the images that pass the box filters (:mod:`interp.studies.aggregation.pib`);
  None without boxes;
* ``top1_agreement``: share of all images where the row's top-1 class equals the baseline's;
* ``accuracy``: top-1 accuracy when the image folders name the classes (:func:`interp.studies.core.behaviour.target_classes`).

Both only through a real classifier (a classifier file, or a head that is one; :mod:`interp.studies.core.behaviour`),
else None and the table shows the pooled vector's cosine to the baseline's instead. ``conditions`` holds every
row's behaviour metrics under its row name.

Per batch of images: one baseline forward, then one forward per k under ``SelectiveCLS(k)``
(:func:`~interp.runtime.paired.paired_pass`).

>>> result = selective_cls_study(source, boxes="boxes.csv", ks=[1, 7, 196], max_box_fraction=1, progress=False)
>>> print(result.table().splitlines()[0])
     row    k    pib  pib_ci_low  pib_ci_high  fg_score_mean  bg_score_mean  pooled_cosine
>>> result.behaviour_note is not None             # planted_vit's random head classifies nothing: no agreement
True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ...errors import InterpError
from ...interventions.selective_cls import SelectiveCLS
from ..core.behaviour import BehaviourMeter, behaviour_readout
from ...runtime.paired import Condition, paired_pass
from .patch_score import ScoreDistribution, fg_bg_distributions
from ..core.score_maps import FINAL, needed_hooks, score_maps_from_acts
from .pib import last_protocol_source, pib_from_maps, protocol_regions
from ..core.result import StudyResult, behaviour_lines
from ..declaration import study
from .configs import SelectiveCLSConfig
from ...runtime.source import require_live

COLUMNS = ("row", "k", "pib", "pib_ci_low", "pib_ci_high", "fg_score_mean", "bg_score_mean", "top1_agreement",
           "accuracy")
BASELINE_REFERENCES = ("cls", "pooled")


@dataclass
class SelectiveCLSResult(StudyResult):
    """Result of :func:`selective_cls_study`.

    Attributes:
        columns: the table's column names (``COLUMNS``).
        rows: one dict per row (baseline first, then each k), keyed by column.
        distributions: per row {"fg": ScoreDistribution, "bg": ScoreDistribution} (None without boxes).
        hits: per row, per image PiB hit (None for images the box filters excluded).
        n_images, n_used, excluded: images in the source / with a usable box / excluded by reason.
        conditions: row name -> behaviour metrics (``interp.studies.core.behaviour.METRICS``); classifier: which
            classifier they used; behaviour_note: why there is no agreement or accuracy.
    """

    study = "selective_cls"
    columns: List[str] = field(default_factory=lambda: list(COLUMNS))
    rows: List[Dict] = field(default_factory=list)
    ks: List[int] = field(default_factory=list)
    reference: str = "cls"
    selective: Dict = field(default_factory=dict)
    n_images: int = 0
    n_used: int = 0
    excluded: Dict[str, int] = field(default_factory=dict)
    level: float = 0.95
    n_boot: int = 1000
    ids: List[str] = field(default_factory=list)
    distributions: List[Optional[Dict]] = field(default_factory=list)
    hits: List[List[Optional[bool]]] = field(default_factory=list)
    conditions: Dict[str, Dict] = field(default_factory=dict)
    classifier: Optional[Dict] = None
    behaviour_note: Optional[str] = None

    def __post_init__(self):
        self.distributions = [None if d is None else {key: ScoreDistribution.from_dict(v) for key, v in d.items()}
                              for d in self.distributions]

    def console_lines(self, config=None) -> List[str]:
        """The table, what the behaviour metrics went through, and the images used."""
        return [self.table(), *behaviour_lines(self),
                f"{self.n_used} of {self.n_images} images with a usable box; excluded: {self.excluded}"]

    def table(self) -> str:
        """The rows as an aligned text table (None shown as '-'); without class logits the pooled vector's cosine
        to the baseline's replaces top-1 agreement and accuracy."""
        def cell(v) -> str:
            if v is None:
                return "-"
            return f"{v:.3f}" if isinstance(v, float) else str(v)

        columns = list(self.columns)
        values = [dict(row) for row in self.rows]
        if self.conditions and all(row.get("top1_agreement") is None for row in self.rows):
            columns = [c for c in columns if c not in ("top1_agreement", "accuracy")] + ["pooled_cosine"]
            for row in values:
                row["pooled_cosine"] = self.conditions.get(row["row"], {}).get("pooled_cosine")
        cells = [columns] + [[cell(row.get(c)) for c in columns] for row in values]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _check_ks(ks: Sequence[int], n_patches: int) -> List[int]:
    ks = [int(k) for k in ks]
    bad = [k for k in ks if not 1 <= k <= n_patches]
    if bad:
        raise InterpError(f"k = {bad} out of range: this model has {n_patches} patches, so k must be in "
                          f"[1, {n_patches}]")
    return ks


def _forward_rows(source, specs: Sequence[SelectiveCLS], reference: str, progress: bool, meter: BehaviourMeter,
                  names: Sequence[str]):
    """Patch Score maps [N, h, w] per row (baseline, then one row per spec); each row's behaviour goes to
    ``meter`` under its name in ``names``."""
    n_rows = 1 + len(specs)
    maps: List[List[torch.Tensor]] = [[] for _ in range(n_rows)]
    rows = {names[0]: Condition(hooks=needed_hooks(FINAL, reference)),
            **{name: Condition([spec], hooks=[FINAL]) for name, spec in zip(names[1:], specs)}}
    for pair in paired_pass(source, rows, detect_layer=None, classifier=meter.readout.classifier, baseline=False,
                            progress=progress, desc="selective-cls"):
        base = pair.edited[names[0]]
        maps[0].append(score_maps_from_acts(base.acts, base.layout, FINAL, reference))
        meter.add(names[0], pair.start, base.logits, base.pooled, base.logits, base.pooled)
        for row, spec in enumerate(specs, start=1):
            run = pair.edited[names[row]]
            maps[row].append(score_maps_from_acts(run.acts, run.layout, FINAL, "selective", spec))
            meter.add(names[row], pair.start, run.logits, run.pooled, base.logits, base.pooled)
    return [torch.cat(m) for m in maps]


def _table_row(name: str, k: Optional[int], row_maps, behaviour: Dict, regions, pib: Dict):
    """One table row (a dict keyed by COLUMNS), its fg/bg distributions and PiB summary (None without boxes)."""
    entry = {"row": name, "k": k, "pib": None, "pib_ci_low": None, "pib_ci_high": None, "fg_score_mean": None,
             "bg_score_mean": None, "top1_agreement": behaviour["top1_agreement"], "accuracy": behaviour["accuracy"]}
    if regions is None:
        return entry, None, None
    summary = pib_from_maps(row_maps, regions, pib["n_boot"], pib["level"], pib["seed"])
    fg, bg = fg_bg_distributions(row_maps, regions, pib["bins"])
    entry.update(pib=summary.pib, pib_ci_low=summary.ci_low, pib_ci_high=summary.ci_high,
                 fg_score_mean=fg.mean, bg_score_mean=bg.mean)
    return entry, {"fg": fg, "bg": bg}, summary


@study(SelectiveCLSConfig)
def selective_cls_study(source, config: SelectiveCLSConfig, *, selective: Optional[SelectiveCLS] = None,
                        progress: bool = True) -> SelectiveCLSResult:
    """PiB, Patch Score distributions and top-1 agreement with and without ``SelectiveCLS(k)`` (module doc).

    Args:
        source: a live source over image files (labels from an image-folder layout give accuracy).
        config: the options (:class:`~interp.studies.aggregation.configs.SelectiveCLSConfig`; or pass them as
            keywords, a group's flat): ``objects`` (``boxes`` box file or table, :mod:`interp.formats.box_files`;
            None skips the PiB and fg/bg columns; ``single_object``, ``max_box_fraction``, ``protocol``
            ``"model"``, the model's transform, or ``"last"``, the LaSt reference's, as in
            :func:`interp.studies.aggregation.pib.pib_study`); ``ks`` the k values, each in [1, n_patches];
            ``selective_cls`` (``sigma``, ``score``, ``fft``, ``eps``) the SelectiveCLS every row uses (default
            the LaSt reference code's arithmetic); ``reference`` the baseline's global vector, ``cls`` or
            ``pooled``; ``bootstrap`` (``n_boot``, ``level``) and ``seed``: the PiB interval; ``bins`` histogram
            bins; ``classifier`` a classifier file (or object) whose class logits give top-1 agreement and
            accuracy.
        selective: a ``SelectiveCLS`` whose sigma, score, fft and eps every row uses instead of the config's
            (its k is replaced by each of ``ks``).
        progress: show progress bars.
    """
    c, objects = config, config.objects
    boxes, protocol = objects.boxes, objects.protocol
    single_object, max_box_fraction = objects.single_object, objects.max_box_fraction
    reference, ks, seed, bins = c.reference, c.ks, c.seed, c.bins
    n_boot, level = c.bootstrap.n_boot, c.bootstrap.level
    regions = None
    if boxes is not None:
        source, regions, single_object, max_box_fraction = protocol_regions(source, boxes, protocol, single_object,
                                                                             max_box_fraction)
    elif protocol == "last":
        source = last_protocol_source(source)
    elif protocol != "model":
        raise InterpError(f"protocol={protocol!r}: use 'model' or 'last'")
    require_live(source, "selective-cls study (with and without SelectiveCLS)")
    if reference not in BASELINE_REFERENCES:
        raise InterpError(f"the baseline reference must be one of {list(BASELINE_REFERENCES)}, got {reference!r}")
    ks = _check_ks(ks, source.layout.n_patches)
    template = (selective or SelectiveCLS(**c.selective_cls.params(1))).params()
    template.pop("k")
    specs = [SelectiveCLS(k=k, **template) for k in ks]

    readout = behaviour_readout(source, c.classifier)
    meter = BehaviourMeter(readout)
    names = ["baseline"] + [f"k={k}" for k in ks]
    maps = _forward_rows(source, specs, reference, progress, meter, names)
    pib = {"n_boot": n_boot, "level": level, "seed": seed, "bins": bins}
    rows, distributions, hits, summary = [], [], [], None
    for row, row_maps in enumerate(maps):
        name, k = names[row], None if row == 0 else ks[row - 1]
        entry, dist, row_summary = _table_row(name, k, row_maps, meter.metrics(name), regions, pib)
        rows.append(entry)
        distributions.append(dist)
        hits.append(row_summary.hits if row_summary is not None else [])
        summary = row_summary or summary

    params = {"ks": ks, **template, "reference": reference, "boxes": boxes is not None, "protocol": protocol,
              "single_object": single_object, "max_box_fraction": max_box_fraction, "n_boot": n_boot,
              "level": level, "bins": bins}
    return SelectiveCLSResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=seed,
        rows=rows, ks=ks, reference=reference, selective=template, n_images=len(source),
        n_used=summary.n_used if summary is not None else 0,
        excluded=regions.excluded_counts() if regions is not None else {}, level=level, n_boot=n_boot,
        ids=list(source.ids), distributions=distributions, hits=hits, conditions=meter.conditions(),
        classifier=readout.record(), behaviour_note=readout.note,
    )
