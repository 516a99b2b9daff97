"""Figure of the redundancy study (Darcet et al., Fig. 5a; docs/methods.md section 1): the distribution of each
token's cosine similarity to its 4 neighbouring input patches, normal vs high-norm tokens.

>>> from interp.studies.artifacts.redundancy import redundancy_study
>>> fig = neighbour_similarity(redundancy_study(source, progress=False))
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from matplotlib.figure import Figure

from .common import MLP_COLOR, ATTN_COLOR, message_figure, near_one, short_name
from ..studies.artifacts.redundancy import RedundancyResult
from .registry import figure

GROUP_STYLE = {"normal": ("normal tokens", ATTN_COLOR), "high_norm": ("high-norm tokens", MLP_COLOR)}


@figure(RedundancyResult, "neighbour_similarity")
def neighbour_similarity(result) -> Optional[Figure]:
    """Density of the per-token neighbour similarity of each group (a group without statistics is named in
    the legend with its note instead of a curve); a message figure when neither group has one."""
    edges = np.asarray(result.hist_edges, dtype=np.float64)
    title = f"{short_name(result.model, 40)}: input patches vs their 4 neighbours ({result.hook})"
    drawable = [g for g in GROUP_STYLE if (result.groups.get(g) or {}).get("mean") is not None]
    if edges.size < 2 or not drawable:
        notes = "; ".join(f"{GROUP_STYLE[g][0]}: {(result.groups.get(g) or {}).get('note')}" for g in GROUP_STYLE)
        return message_figure(title, "no distribution to draw", notes)
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    ax = fig.add_subplot()
    widths = np.diff(edges)
    for group, (label, color) in GROUP_STYLE.items():
        entry = result.groups.get(group) or {}
        if entry.get("mean") is None:
            ax.plot([], [], color=color, label=f"{label}: {entry.get('note')}")
            continue
        counts = np.asarray(entry["histogram"], dtype=np.float64)
        density = counts / (counts.sum() * widths)
        ax.stairs(density, edges, color=color, fill=True, alpha=0.25)
        ax.stairs(density, edges, color=color,
                  label=f"{label} (n={entry['n_tokens']}): median {near_one(entry['median'], gap=False)}")
        ax.axvline(entry["median"], color=color, linestyle=":", linewidth=1)
    ax.set_xlim(-1, 1)
    ax.set_xlabel("cosine similarity to the 4 neighbouring input patches (mean per token)")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return fig
