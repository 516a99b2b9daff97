"""Cross-model comparison (SCIENCE.md section 4): the same norms battery on several models, one table.

Protocol (Baxevanakis et al.): token norms before the final LayerNorm; last-block CLS->patch attention
averaged over heads; high-norm = above each model's own threshold (default: automatic bimodal split; pass
"p98" for the per-model 98th percentile of the reassessment).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from .norms import norms_study
from .result import StudyResult
from .source import open_source

COLUMNS = ("model", "artifacts", "threshold", "outlier_%", "max/median", "emergence", "cls_attn_on_outliers")


@dataclass
class ComparisonResult(StudyResult):
    """Result of :func:`compare_models`: ``rows`` holds one dict per model with the keys of ``COLUMNS``."""

    study = "compare"
    rows: List[Dict] = field(default_factory=list)

    def table(self) -> str:
        """The rows as an aligned plain-text table."""
        cells = [list(COLUMNS)] + [[_fmt(r[c]) for c in COLUMNS] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells)


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


def compare_models(models: Sequence, images, *, threshold="auto", batch_size: int = 16, progress: bool = True,
                   names: Optional[Sequence[str]] = None) -> ComparisonResult:
    """Run the norms study on each HookedViT over the same images and collect one row per model."""
    rows = []
    for i, model in enumerate(models):
        name = names[i] if names else model.model_name
        result = norms_study(open_source(model=model, images=images, batch_size=batch_size),
                             threshold=threshold, batch_size=batch_size, progress=progress)
        rows.append(summary_row(name, result))
    params = {"models": [r["model"] for r in rows], "threshold": threshold, "batch_size": batch_size}
    return ComparisonResult(model=",".join(params["models"]), fingerprint="", params=params, seed=None, rows=rows)
