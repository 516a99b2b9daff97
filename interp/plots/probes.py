"""Figure of the linear-probe study (Darcet et al. Fig. 5b: position and pixels; Table 1: the label from one
token): one bar per token group and probe, with the chance level drawn over each bar. The pixel panel shows
the mean per-token L2 reconstruction error (lower is better; the paper's measure, in the model's normalised
input space), not R^2, which divides by each group's own variance and can swap the groups' order. A group
without a score (empty, too few tokens) gets its reason written in place of the bar and a "not scored" mark
under its name; a result on too few images is one message, not a figure of noise.

>>> from interp.studies.probes.probes import probes_study
>>> fig = probe_bars(probes_study(source, tasks=("position",), progress=False))
>>> fig.savefig("probes.png", dpi=110, bbox_inches="tight")
"""
from __future__ import annotations

import textwrap
from typing import Dict, List, NamedTuple

from matplotlib.figure import Figure

from .common import message_figure
from ..studies.probes.probes import ProbesResult
from .registry import figure


class Panel(NamedTuple):
    """One probe's panel: its title, y label, the GroupScore attributes drawn as bar and as chance tick,
    and whether lower is better (an error: the axis starts at 0)."""

    title: str
    ylabel: str
    value: str
    chance: str
    lower_is_better: bool = False


# probe attribute of a ProbesResult -> its panel
PANELS: Dict[str, Panel] = {
    "position": Panel("position (patch index; Fig. 5b)", "top-1 accuracy", "score", "chance"),
    "pixels": Panel("pixels (own input patch; Fig. 5b)", "mean L2 error per token (lower is better)",
                    "l2_error", "chance_l2_error", True),
    "label": Panel("global (image label, one token; Table 1)", "top-1 accuracy", "score", "chance"),
}
GROUP_COLORS = {"normal": "#4c72b0", "high_norm": "#d62728", "cls": "#2ca02c", "register": "#9467bd"}
CHANCE_COLOR = "black"
NOT_SCORED = "not scored"  # the mark under a group that has data but too little for a score


def _panels(result) -> List[tuple]:
    """(probe, Panel, {group: GroupScore}) for the probes that ran."""
    return [(probe, panel, getattr(result, probe)) for probe, panel in PANELS.items() if getattr(result, probe)]


def _limits(groups: Dict, panel: Panel) -> tuple:
    """(low, high) of a panel's y axis: accuracies span [min(0, values), 1]; errors [0, 1.1 x the largest]."""
    values = [v for g in groups.values() for v in (getattr(g, panel.value), getattr(g, panel.chance))
              if v is not None]
    if panel.lower_is_better:
        return 0.0, 1.1 * max(values) if values and max(values) > 0 else 1.0
    low = min([0.0] + values)
    return low - 0.02 * (1.0 - low), 1.02


def _tick(name: str, entry) -> str:
    mark = f"\n{NOT_SCORED}" if entry.too_few else ""
    return f"{name.replace('_', '-')}\nn={entry.n}{mark}"


@figure(ProbesResult, "probes")
def probe_bars(result) -> Figure:
    """Bars of each probe's test figure per token group (accuracy; the pixels' mean L2 error), a dashed black
    tick at the group's chance level, and the reason (empty, too few tokens) in place of the bar for a group
    without a score; ``n`` under each bar. The y axis spans every value (never clipped)."""
    panels = _panels(result)
    heading = f"{result.model}: linear probes"
    if not panels:
        return message_figure(heading, "no probe ran", "; ".join(result.notes) or "no task was asked for")
    if result.too_few:
        return message_figure(heading, "too few images for probe scores", result.too_few)
    fig = Figure(figsize=(3.4 * len(panels), 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (probe, panel, groups) in zip(axes, panels):
        names, chance_label = list(groups), "chance"
        low, high = _limits(groups, panel)
        ax.set_ylim(low, high)
        for x, name in enumerate(names):
            entry = groups[name]
            value, chance = getattr(entry, panel.value), getattr(entry, panel.chance)
            if value is None:
                reason = textwrap.fill(entry.note or "no score", 20)
                ax.text(x, (low + high) / 2, reason, ha="center", va="center", fontsize=6.5, color="#555")
                continue
            ax.bar(x, value, color=GROUP_COLORS.get(name, "#888"), width=0.7)
            if chance is not None:
                ax.hlines(chance, x - 0.38, x + 0.38, colors=CHANCE_COLOR, linewidths=1.5,
                          linestyles="--", label=chance_label)
                chance_label = None  # one legend entry per panel
        ax.set_xticks(range(len(names)), [_tick(n, groups[n]) for n in names], fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.axhline(0, color="#999", linewidth=0.6)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel, fontsize=8 if panel.lower_is_better else 10)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        if not handles:
            handles, labels = ax.get_legend_handles_labels()
    if handles:  # one legend for every panel, below the axes: it covers no bar
        fig.legend(handles, labels, loc="outside lower center", fontsize=7, frameon=False)
    share = 100 * result.high_norm_share
    caveat = f"; {len(result.unscored)} group(s) {NOT_SCORED}: too little data" if result.unscored else ""
    fig.suptitle(f"{result.model}: linear probes at {result.hook} (high-norm {share:.2f} % of patches{caveat})",
                 fontsize=10)
    return fig
