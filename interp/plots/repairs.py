"""The repairs study's figure (docs/methods.md section 2, "Every training-free repair on one table"): each repair's
outliers left, CLS attention on the artifacts, behaviour and patch-feature cosine; SINDER's direction per block.

>>> from interp.studies.repairs.repairs import repairs_study
>>> fig = repairs_table(repairs_study(source, sinder_samples=2000, progress=False)); fig.savefig("repairs.png")
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from matplotlib.figure import Figure

from ..studies.repairs.repairs import LABELS, RepairsResult
from .common import short_name
from .registry import figure

COLUMNS = (("outlier_count", "outliers at the detection block"),
           ("cls_attention_on_artifacts", "CLS attention on the artifacts"),
           (None, "behaviour"),  # the result's headline metric
           ("patch_cosine", "patch cosine to intact (normal patches)"))


@figure(RepairsResult, "repairs_table")
def repairs_table(result: RepairsResult) -> Optional[Figure]:
    """One bar panel per column over the repairs that ran (n/a repairs are named under the figure); a last panel
    with SINDER's |cos| to the measured artifact direction per block, random directions' level dashed. None when
    no artifacts were found and SINDER did not run."""
    ran = [n for n, r in result.rows.items() if r.get("status") == "ran"]
    sinder = (result.sinder or {}).get("blocks")
    panels = (len(COLUMNS) if ran else 0) + (1 if sinder else 0)
    if not panels:
        return None
    fig = Figure(figsize=(3.2 * panels, 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, panels))
    if ran:
        labels = [LABELS[n] for n in ran]
        for ax, (key, title) in zip(axes, COLUMNS):
            key = key or result.metric
            values = [result.rows[n][key] for n in ran]
            shown = [np.nan if v is None else v for v in values]
            ax.barh(range(len(ran)), shown, color=["#7f8c8d" if n == "intact" else "#2980b9" for n in ran])
            ax.set_yticks(range(len(ran)), labels if ax is axes[0] else [""] * len(ran), fontsize=8)
            ax.invert_yaxis()
            ax.set_title(title if key != result.metric else f"{title}: {result.metric.replace('_', ' ')}", fontsize=9)
            for i, v in enumerate(values):
                ax.text(0, i, " n/a" if v is None else f" {v:.3g}", va="center", fontsize=7)
        skipped = [f"{LABELS[n]}: {r['reason']}" for n, r in result.rows.items() if r.get("status") == "n/a"]
        if skipped:
            fig.supxlabel("; ".join(skipped), fontsize=7)
    if sinder:
        ax = axes[-1]
        cos = [np.nan if b["cos_measured"] is None else b["cos_measured"] for b in sinder]
        ax.plot([b["block"] for b in sinder], cos, marker="o", color="#c0392b", label="vs measured direction")
        ax.axhline(result.sinder["chance"], color="#7f8c8d", linestyle="--", linewidth=1, label="random directions")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("block")
        ax.set_ylabel("|cos|")
        ax.set_title("SINDER direction (weights only)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"{short_name(result.model, 40)}: training-free repairs ({len(result.ids)} images)", fontsize=10)
    return fig
