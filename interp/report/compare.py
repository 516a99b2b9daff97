"""Cross-model comparison (docs/methods.md section 6): the same norms battery, the same redundancy measure and
the same linear probes on several models, one table. It is this project's summary over the reassessment's
protocol, not a reproduction of any one published table (no paper has exactly these columns).

Protocol (Baxevanakis et al.): token norms before the final LayerNorm; last-block CLS->patch attention
averaged over heads; high-norm = above each model's own threshold, one :class:`DetectionSpec` for every model
(default: the automatic two-mode split at the last block; ``DetectionSpec(preset="reassessment")`` or
``DetectionSpec(threshold="p98")`` for the per-model 98th percentile, ``DetectionSpec(preset="darcet")`` for 150
at the last block). The probes
(:mod:`interp.studies.probes.probes`) read the last block's residual stream with the same detection, on a
capped number of tokens (``probe_tokens``) so the table stays quick on small models.

Columns: :data:`COLUMN_DOCS`, one line each (the README's table is :func:`column_table`); ``-`` = no value
(an empty or too small token group, too few images for a probe, no label), the reason printed under the table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from ..studies.artifacts.norms import norms_study
from ..studies.artifacts.redundancy import redundancy_study
from ..detection.detection import DetectionSpec, RunOptions, detect, threshold_param
from ..studies.probes.probes import probes_study
from ..studies.core.result import StudyResult, skipped_records
from ..models.inputs.preprocessing import eval_transform
from ..runtime.open import open_source

NORM_COLUMNS = ("model", "artifacts", "threshold", "outlier_%", "max/median", "emergence", "cls_attn_on_outliers",
                "redund_normal", "redund_high")
# redundancy column -> token group of a RedundancyResult
REDUNDANCY_COLUMNS = {"redund_normal": "normal", "redund_high": "high_norm"}
# probe column -> (probe, token group) of a ProbesResult
PROBE_COLUMNS = {"pos_normal": ("position", "normal"), "pos_high": ("position", "high_norm"),
                 "pix_normal": ("pixels", "normal"), "pix_high": ("pixels", "high_norm"),
                 "glob_cls": ("label", "cls"), "glob_normal": ("label", "normal"),
                 "glob_high": ("label", "high_norm")}
CHANCE_COLUMNS = {"pos_chance": ("position", "normal"), "glob_chance": ("label", "cls")}
MSE_COLUMNS = {"pix_mse_normal": ("pixels", "normal"), "pix_mse_high": ("pixels", "high_norm")}
COLUMNS = NORM_COLUMNS + tuple(PROBE_COLUMNS) + tuple(MSE_COLUMNS) + tuple(CHANCE_COLUMNS)
COLUMN_DOCS = {
    "model": "the model (with its weights file when one was given)",
    "artifacts": "whether the detection found register artifacts (artifacts_found)",
    "threshold": "the resolved norm threshold at the detection block (-: auto found no separated mode)",
    "outlier_%": "share of patch tokens above the threshold, in percent",
    "max/median": "max over median patch norm at the detection block",
    "emergence": "block and step (attn or mlp) where the max patch norm jumps",
    "cls_attn_on_outliers": "share of the last block's CLS->patch attention (head mean) on the outliers",
    "redund_normal": "median cosine of a normal token's input patch embedding to its 4 neighbours",
    "redund_high": "median cosine of a high-norm token's input patch embedding to its 4 neighbours",
    "pos_normal": "position probe top-1 on normal patch tokens",
    "pos_high": "position probe top-1 on high-norm patch tokens",
    "pix_normal": "pixel-reconstruction probe R^2 on normal patch tokens",
    "pix_high": "pixel-reconstruction probe R^2 on high-norm patch tokens",
    "pix_mse_normal": "pixel-reconstruction probe MSE per pixel value on normal patch tokens (the reassessment's "
                      "measure)",
    "pix_mse_high": "pixel-reconstruction probe MSE per pixel value on high-norm patch tokens",
    "glob_cls": "image-label probe top-1 from the CLS token",
    "glob_normal": "image-label probe top-1 from one normal patch token",
    "glob_high": "image-label probe top-1 from one high-norm patch token",
    "pos_chance": "chance level of the position probe",
    "glob_chance": "chance level of the label probe",
}
# the probes' budget in the table: fewer Adam steps than a probes study (100 instead of 300) keeps a small
# model's row to seconds on a CPU; pass probe_options to change it
PROBE_OPTIONS = {"min_steps": 100}


@dataclass(frozen=True)
class CompareSettings:
    """How every model of a comparison is measured.

    Attributes:
        detection: one detection rule for every model (a percentile or "auto" is each model's own threshold).
        batch_size: images per forward pass.
        probes: run the linear probes, on at most ``probe_tokens`` training tokens each, fitted with
            :data:`PROBE_OPTIONS` and the ``probe_options`` given over them.
        seed: the probes' token sample and initialisation.
        strict: stop at the first unreadable image (default: leave it out, listed in ``skipped``).
        preprocess: one eval transform for every model's images (``"resize256-crop224"``; None: each model's own).
        progress: progress bars and stage lines.
    """

    detection: DetectionSpec = field(default_factory=DetectionSpec)
    batch_size: int = 16
    probes: bool = True
    probe_tokens: int = 2000
    probe_options: Optional[Mapping] = None
    seed: int = 0
    strict: bool = False
    preprocess: Optional[str] = None
    progress: bool = True

    def probe_budget(self) -> Dict:
        """The probes' options: :data:`PROBE_OPTIONS` and the ``probe_options`` given over them."""
        return {**PROBE_OPTIONS, **(self.probe_options or {})}

    def params(self) -> Dict:
        """The settings as a result's ``params`` (the detection rule resolved: a preset's values filled in)."""
        spec = self.detection.resolved()
        return {"threshold": threshold_param(spec.threshold), "detect_layer": spec.detect_layer,
                "preset": spec.preset, "batch_size": self.batch_size, "probes": self.probes,
                "probe_tokens": self.probe_tokens, "probe_options": self.probe_budget(), "seed": self.seed,
                "preprocess": preprocess_name(self.preprocess)}


def column_table() -> str:
    """The README's markdown table of the comparison's columns (from :data:`COLUMN_DOCS`)."""
    return "| column | what it is |\n|---|---|\n" + "".join(f"| `{c}` | {COLUMN_DOCS[c]} |\n" for c in COLUMNS)


@dataclass
class ComparisonResult(StudyResult):
    """Result of :func:`compare_models`: ``rows`` holds one dict per model with the keys of ``COLUMNS``."""

    study = "compare"
    rows: List[Dict] = field(default_factory=list)
    notes: Dict[str, Dict[str, str]] = field(default_factory=dict)  # model -> {column: why it is "-"}

    def table(self) -> str:
        """The rows as an aligned plain-text table (the probe columns when the rows have them)."""
        columns = [c for c in COLUMNS if c in NORM_COLUMNS or any(c in r for r in self.rows)]
        cells = [list(columns)] + [[_fmt(r.get(c)) for c in columns] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        for r in self.rows:  # why a cell is "-": one line per model and reason
            by_reason: Dict[str, List[str]] = {}
            for col, note in self.notes.get(r["model"], {}).items():
                by_reason.setdefault(note, []).append(col)
            lines += [f"- {r['model']} {', '.join(cols)}: {note}" for note, cols in by_reason.items()]
        return "\n".join(lines)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def summary_row(name: str, result) -> Dict:
    """One comparison row from a NormsResult."""
    last = result.detect_layer
    post_max = result.max_patch_norm["resid_post"][last]
    post_median = result.median_patch_norm["resid_post"][last]
    emergence = result.emergence
    attn = result.cls_attention_on_outliers
    return {
        "model": name,
        "artifacts": result.artifacts_found,
        "threshold": result.threshold,
        "outlier_%": 100.0 * result.outlier_fraction,
        "max/median": post_max / post_median if post_median else None,
        "emergence": f"{emergence['layer']} ({emergence['component']})" if emergence else None,
        "cls_attn_on_outliers": attn[-1] if attn and result.artifacts_found else None,
    }


def redundancy_columns(result) -> Dict:
    """The redundancy columns of one comparison row from a RedundancyResult (the groups' medians)."""
    return {col: result.groups[group]["median"] for col, group in REDUNDANCY_COLUMNS.items()}


def redundancy_notes(result) -> Dict[str, str]:
    """{redundancy column: why it has no number} (an empty or too small token group)."""
    return {col: result.groups[group]["note"] for col, group in REDUNDANCY_COLUMNS.items()
            if result.groups[group]["median"] is None and result.groups[group]["note"]}


def probe_columns(result) -> Dict:
    """The probe columns of one comparison row from a ProbesResult (None for an empty group)."""
    def score(probe: str, group: str, attr: str = "score"):
        entry = getattr(result, probe).get(group)
        return None if entry is None else getattr(entry, attr)

    row = {col: score(*where) for col, where in PROBE_COLUMNS.items()}
    row.update({col: score(*where, attr="chance") for col, where in CHANCE_COLUMNS.items()})
    row.update({col: score(*where, attr="mse") for col, where in MSE_COLUMNS.items()})
    return row


def probe_notes(result) -> Dict[str, str]:
    """{probe column: why it has no number} of a ProbesResult (empty group, too few images or tokens; the
    pixel-MSE columns share the pixel columns' notes)."""
    entries = {col: getattr(result, probe).get(group) for col, (probe, group) in PROBE_COLUMNS.items()}
    return {col: e.note for col, e in entries.items() if e is not None and e.score is None and e.note}


def preprocess_name(preprocess) -> str:
    """``"model"`` or the eval transform's name."""
    t = eval_transform(preprocess)
    return "model" if t is None else t.name


def model_row(source, found, name: str, settings: CompareSettings = CompareSettings()):
    """One model's comparison row and notes on ``source`` with its detection ``found``: the norms study's
    columns, the redundancy columns and (with ``settings.probes``) the probe columns. Returns (row, {column: why
    "-"})."""
    progress = settings.progress
    row = summary_row(name, norms_study(source, detection=found, progress=progress))
    redundancy = redundancy_study(source, detection=found, progress=progress, warn=False)  # the row says it
    row.update(redundancy_columns(redundancy))
    notes = redundancy_notes(redundancy)
    if settings.probes:
        probed = probes_study(source, detection=found, seed=settings.seed, progress=progress,
                              max_train_tokens=settings.probe_tokens,
                              max_test_tokens=max(settings.probe_tokens // 2, 1),
                              probe_options=settings.probe_budget())
        row.update(probe_columns(probed))
        notes.update(probe_notes(probed))
    return row, notes


def compare_models(models: Sequence, images, settings: CompareSettings = CompareSettings(),
                   names: Optional[Sequence[str]] = None) -> ComparisonResult:
    """Run the norms and redundancy studies (and, with ``settings.probes``, the linear probes) on each HookedViT
    over the same ``images`` (what ``open_source`` takes) and collect one row per model (columns:
    :data:`COLUMN_DOCS`; ``names``: the rows' model names, default each model's name).

    The high-norm tokens of every model follow one detection rule (``settings.detection``), resolved once and
    applied to each model (a percentile or "auto" is each model's own). Unreadable images are left out and
    listed in ``skipped`` (``settings.strict``: stop at the first one instead)."""
    spec = settings.detection.resolved()
    rows, skipped, notes = [], [], {}
    for i, model in enumerate(models):
        name = names[i] if names else model.model_name
        source = open_source(model=model, images=images, batch_size=settings.batch_size, strict=settings.strict,
                             preprocess=settings.preprocess)
        skipped = skipped or skipped_records(source)
        source = source.held_if_small()  # decoded once for every pass
        found = detect(source, spec, RunOptions(settings.batch_size, progress=settings.progress))
        row, notes[name] = model_row(source, found, name, settings)
        rows.append(row)
    params = {"models": [r["model"] for r in rows], **settings.params()}
    return ComparisonResult(model=",".join(params["models"]), fingerprint="", params=params, seed=None, rows=rows,
                            skipped=skipped, notes=notes)
