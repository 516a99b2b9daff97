"""Cross-model comparison (docs/methods.md section 6): the same norms battery and the same linear probes on
several models, one table (the reassessment's table).

Protocol (Baxevanakis et al.): token norms before the final LayerNorm; last-block CLS->patch attention
averaged over heads; high-norm = above each model's own threshold (default: automatic bimodal split; pass
"p98" for the per-model 98th percentile of the reassessment). The probes (:mod:`interp.studies.probes.token_probes`) read
the last block's residual stream with the same detection, on a capped number of tokens (``probe_tokens``) so
the table stays quick on small models: position (top-1) and pixels (R^2) on normal / high-norm patches, and the
image label from one CLS / normal / high-norm token when the images carry labels. ``-`` = empty group (e.g.
no high-norm tokens), too few images or tokens for a score (:data:`~interp.studies.probes.token_probes.MIN_IMAGES`), or a
probe that could not run; the reason is printed under the table. The ``*_chance`` columns give the chance levels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from ..studies.artifacts.norms import norms_study
from ..studies.core.outliers import detect
from ..studies.probes.token_probes import probes_study
from ..studies.core.result import StudyResult, skipped_records
from ..studies.core.source import open_source

NORM_COLUMNS = ("model", "artifacts", "threshold", "outlier_%", "max/median", "emergence", "cls_attn_on_outliers")
# probe column -> (probe, token group) of a ProbesResult
PROBE_COLUMNS = {"pos_normal": ("position", "normal"), "pos_high": ("position", "high_norm"),
                 "pix_normal": ("pixels", "normal"), "pix_high": ("pixels", "high_norm"),
                 "glob_cls": ("label", "cls"), "glob_normal": ("label", "normal"),
                 "glob_high": ("label", "high_norm")}
CHANCE_COLUMNS = {"pos_chance": ("position", "normal"), "glob_chance": ("label", "cls")}
COLUMNS = NORM_COLUMNS + tuple(PROBE_COLUMNS) + tuple(CHANCE_COLUMNS)
# the probes' budget in the table: fewer Adam steps than a probes study (100 instead of 300) keeps a small
# model's row to seconds on a CPU; pass probe_options to change it
PROBE_OPTIONS = {"min_steps": 100}


@dataclass
class ComparisonResult(StudyResult):
    """Result of :func:`compare_models`: ``rows`` holds one dict per model with the keys of ``COLUMNS``."""

    study = "compare"
    rows: List[Dict] = field(default_factory=list)
    notes: Dict[str, Dict[str, str]] = field(default_factory=dict)  # model -> {probe column: why it is "-"}

    def table(self) -> str:
        """The rows as an aligned plain-text table (the probe columns when the rows have them)."""
        columns = [c for c in COLUMNS if c in NORM_COLUMNS or any(c in r for r in self.rows)]
        cells = [list(columns)] + [[_fmt(r.get(c)) for c in columns] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        for r in self.rows:  # why a probe cell is "-": one line per model and reason
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


def probe_columns(result) -> Dict:
    """The probe columns of one comparison row from a ProbesResult (None for an empty group)."""
    def score(probe: str, group: str, attr: str = "score"):
        entry = getattr(result, probe).get(group)
        return None if entry is None else getattr(entry, attr)

    row = {col: score(*where) for col, where in PROBE_COLUMNS.items()}
    row.update({col: score(*where, attr="chance") for col, where in CHANCE_COLUMNS.items()})
    return row


def probe_notes(result) -> Dict[str, str]:
    """{probe column: why it has no number} of a ProbesResult (empty group, too few images or tokens)."""
    entries = {col: getattr(result, probe).get(group) for col, (probe, group) in PROBE_COLUMNS.items()}
    return {col: e.note for col, e in entries.items() if e is not None and e.score is None and e.note}


def compare_models(models: Sequence, images, *, threshold="auto", batch_size: int = 16, progress: bool = True,
                   names: Optional[Sequence[str]] = None, probes: bool = True, probe_tokens: int = 2000,
                   probe_options: Optional[Dict] = None, seed: int = 0, strict: bool = False) -> ComparisonResult:
    """Run the norms study (and, with ``probes``, the linear probes on at most ``probe_tokens`` training
    tokens, fitted with ``probe_options`` (default :data:`PROBE_OPTIONS`)) on each HookedViT over the same
    images and collect one row per model. Unreadable images are left out and listed in ``skipped``
    (``strict``: stop at the first one instead)."""
    probe_options = dict(PROBE_OPTIONS if probe_options is None else probe_options)
    rows, skipped, notes = [], [], {}
    for i, model in enumerate(models):
        name = names[i] if names else model.model_name
        source = open_source(model=model, images=images, batch_size=batch_size, strict=strict)
        skipped = skipped or skipped_records(source)
        source = source.held_if_small()  # decoded once for the three passes
        found = detect(source, threshold, batch_size=batch_size, progress=progress)
        result = norms_study(source, detection=found, batch_size=batch_size, progress=progress)
        rows.append(summary_row(name, result))
        if probes:
            probed = probes_study(source, detection=found, seed=seed, batch_size=batch_size, progress=progress,
                                  max_train_tokens=probe_tokens, max_test_tokens=max(probe_tokens // 2, 1),
                                  probe_options=probe_options)
            rows[-1].update(probe_columns(probed))
            notes[name] = probe_notes(probed)
    params = {"models": [r["model"] for r in rows], "threshold": threshold, "batch_size": batch_size,
              "probes": probes, "probe_tokens": probe_tokens, "probe_options": probe_options, "seed": seed}
    return ComparisonResult(model=",".join(params["models"]), fingerprint="", params=params, seed=None, rows=rows,
                            skipped=skipped, notes=notes)
