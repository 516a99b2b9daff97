"""The reassessment's figure: claims 3, 4 and 5 side by side, one pair of bars per model (normal vs high-norm
tokens; without vs with a test-time register), a model without a number labelled with its cell's text
("no artifacts", "n/a").

>>> from interp.report.reassessment import ReassessSettings, reassess_models
>>> fig = reassessment_figure(reassess_models([model], photos, ReassessSettings(probes=False, progress=False)))
>>> len(fig.axes)
3
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..plots.common import ATTN_COLOR, MLP_COLOR, short_name

# (row, panel title, (value key, bar label) x 2, the row's dotted reference key or None)
PANELS = (
    ("redundancy", "3: neighbour similarity", (("normal", "normal"), ("high_norm", "high-norm")), None),
    ("position_probe", "4: position probe top-1", (("normal", "normal"), ("high_norm", "high-norm")), "chance"),
    ("ttr_attention", "5: CLS attention on artifacts", (("without", "no register"), ("with", "test-time register")),
     "uniform"),
)


def _shown(cell, key: str):
    """A cell's value as a bar; none for an n/a cell (its numbers are kept in the JSON, not drawn)."""
    return None if cell.text == "n/a" else cell.values.get(key)


def reassessment_figure(result) -> Figure:
    """Three panels (redundancy, position probe, test-time register cleanliness) of a ReassessmentResult."""
    models = result.models
    fig = Figure(figsize=(4.0 * len(PANELS), 1.2 + 0.45 * len(models)), layout="constrained")
    axes = fig.subplots(1, len(PANELS), sharey=True)
    y = np.arange(len(models))
    for ax, (row, title, bars, reference) in zip(axes, PANELS):
        for j, ((key, label), color) in enumerate(zip(bars, (ATTN_COLOR, MLP_COLOR))):
            values = [_shown(result.cell(row, m), key) for m in models]
            ax.barh(y + (j - 0.5) * 0.38, [np.nan if v is None else v for v in values], height=0.38,
                    color=color, label=label)
        for i, m in enumerate(models):
            cell = result.cell(row, m)
            if all(_shown(cell, key) is None for key, _ in bars):
                ax.text(0.02, i, cell.text, va="center", fontsize=8, color="0.35", transform=ax.get_yaxis_transform())
            if reference and cell.values.get(reference) is not None:
                ax.plot([cell.values[reference]] * 2, [i - 0.45, i + 0.45], ":", color="k", lw=1)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_yticks(y, [short_name(m, 30) for m in models], fontsize=8)
    axes[0].set_ylim(len(models) - 0.5, -0.5)  # the first model on top, every row in view
    return fig
