"""Figure of the linear-probe study (Darcet et al. Table 1b): one bar per token group and probe, with the
chance level drawn over each bar; a group without a score (empty, too few tokens) gets its reason written in
place of the bar, and a result on too few images is one message, not a figure of noise.

>>> from interp.studies.probes.token_probes import probes_study
>>> fig = probe_bars(probes_study(source, tasks=("position",), progress=False))
>>> fig.savefig("probes.png", dpi=110, bbox_inches="tight")
"""
from __future__ import annotations

import textwrap
from typing import Dict, List, Tuple

from matplotlib.figure import Figure

from .common import message_figure

# probe attribute of a ProbesResult -> (panel title, y label)
PANELS: Dict[str, Tuple[str, str]] = {
    "position": ("position (patch index)", "top-1 accuracy"),
    "pixels": ("pixels (own input patch)", "R\u00b2"),
    "label": ("global (image label, one token)", "top-1 accuracy"),
}
GROUP_COLORS = {"normal": "#4c72b0", "high_norm": "#d62728", "cls": "#2ca02c", "register": "#9467bd"}
CHANCE_COLOR = "black"


def _panels(result) -> List[Tuple[str, str, str, Dict]]:
    """(probe, title, y label, {group: GroupScore}) for the probes that ran."""
    return [(probe, title, ylabel, getattr(result, probe)) for probe, (title, ylabel) in PANELS.items()
            if getattr(result, probe)]


def probe_bars(result) -> Figure:
    """Bars of each probe's test score per token group, a dashed black tick at the group's chance level, and
    the reason (empty, too few tokens) in place of the bar for a group without a score; ``n`` under each bar.
    The y axis spans every score (a negative R^2 is drawn whole, never clipped)."""
    panels = _panels(result)
    heading = f"{result.model}: linear probes"
    if not panels:
        return message_figure(heading, "no probe ran", "; ".join(result.notes) or "no task was asked for")
    if result.too_few:
        return message_figure(heading, "too few images for probe scores", result.too_few)
    fig = Figure(figsize=(3.4 * len(panels), 3.2), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (probe, title, ylabel, groups) in zip(axes, panels):
        names, chance_label = list(groups), "chance"
        values = [v for g in groups.values() for v in (g.score, g.chance) if v is not None]
        low = min([0.0] + values)
        low -= 0.02 * (1.0 - low)
        ax.set_ylim(low, 1.02)
        for x, name in enumerate(names):
            entry = groups[name]
            if entry.score is None:
                reason = textwrap.fill(entry.note or "no score", 20)
                ax.text(x, (low + 1.02) / 2, reason, ha="center", va="center", fontsize=6.5, color="#555")
                continue
            ax.bar(x, entry.score, color=GROUP_COLORS.get(name, "#888"), width=0.7)
            if entry.chance is not None:
                ax.hlines(entry.chance, x - 0.38, x + 0.38, colors=CHANCE_COLOR, linewidths=1.5,
                          linestyles="--", label=chance_label)
                chance_label = None  # one legend entry per panel
        ax.set_xticks(range(len(names)), [f"{n.replace('_', '-')}\nn={groups[n].n}" for n in names], fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.axhline(0, color="#999", linewidth=0.6)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        if not handles:
            handles, labels = ax.get_legend_handles_labels()
    if handles:  # one legend for every panel, below the axes: it covers no bar
        fig.legend(handles, labels, loc="outside lower center", fontsize=7, frameon=False)
    share = 100 * result.high_norm_share
    fig.suptitle(f"{result.model}: linear probes at {result.hook} (high-norm {share:.2f} % of patches)", fontsize=10)
    return fig
