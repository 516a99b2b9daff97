"""Figures of the lazy-aggregation studies (Patch Score, PiB, masking, SelectiveCLS), from results only.

>>> from interp.studies.aggregation.patch_score import patch_score_study
>>> fig = score_maps(patch_score_study(source, progress=False), n=4, only_with_boxes=False)
>>> fig.savefig("maps.png")
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..studies.aggregation.patch_score import PatchScoreResult
from ..studies.aggregation.selective_cls import SelectiveCLSResult
from ..studies.aggregation.masking import MaskingResult
from ..studies.aggregation.pib import PiBResult
from .registry import figure



def _density(dist) -> Tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(dist.counts, dtype=float)
    edges = np.asarray(dist.edges, dtype=float)
    total = counts.sum()
    return (counts / (total * np.diff(edges)) if total else counts), edges


def _distribution_panels(result) -> List[Tuple[str, Dict[str, object]]]:
    """(panel title, {curve label: ScoreDistribution}) for a PatchScoreResult or a SelectiveCLSResult."""
    if isinstance(result, SelectiveCLSResult):  # one panel per row
        panels = []
        for row, dists in zip(result.rows, result.distributions):
            if dists is not None:
                panels.append((str(row["row"]), {"foreground": dists["fg"], "background": dists["bg"]}))
        return panels
    if result.fg is not None:
        return [(f"reference: {result.reference}", {"foreground": result.fg, "background": result.bg})]
    return [(f"reference: {result.reference}", {"all patches": result.scores})]


@figure(PatchScoreResult, "score_distributions")
def score_distributions(result) -> Figure:
    """Patch Score histograms, foreground vs background (all patches when no region was given)."""
    panels = _distribution_panels(result)
    if not panels:
        raise ValueError("this result has no score distributions (run it with boxes)")
    fig = Figure(figsize=(3.6 * len(panels), 3.0), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, dists) in zip(axes, panels):
        for label, dist in dists.items():
            if dist is None or dist.n == 0:
                continue
            density, edges = _density(dist)
            ax.stairs(density, edges, label=f"{label} (mean {dist.mean:.3f}, n={dist.n})", fill=False, linewidth=1.5)
        ax.set_title(title)
        minmax = isinstance(result, PatchScoreResult) and result.normalise == "minmax"
        ax.set_xlabel("Patch Score, min-max per image" if minmax else "Patch Score cos(x_p, g)")
        ax.set_ylabel("density")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best", framealpha=0.7)
        else:
            ax.text(0.5, 0.5, "no patches", ha="center", va="center", transform=ax.transAxes, color="0.4")
    fig.suptitle(f"{result.model}: Patch Score distributions")
    return fig


def _counting_label(value: Optional[float], rule) -> str:
    """``142.3 (p98)``: the counting threshold and the rule it came from."""
    number = "?" if value is None else f"{value:.4g}"
    return number if rule is None or str(rule) == number else f"{number} ({rule})"


@figure(MaskingResult, "masking_curves")
def masking_curves(result) -> Figure:
    """Metric (accuracy or agreement) and outliers per image vs masked fraction: top-k and bottom-k by score, and
    the seeded random order (the control) when the result has it."""
    fig = Figure(figsize=(8.0, 3.2), layout="constrained")
    ax_metric, ax_out = fig.subplots(1, 2)
    fractions = np.asarray(result.fractions) * 100
    styles = {"top": ("-o", "mask top-k by score"), "bottom": ("-s", "mask bottom-k by score"),
              "random": ("--^", "mask k at random (control)")}
    for order, (style, label) in styles.items():
        if order not in result.curves:
            continue
        curve = result.curves[order]
        ax_metric.plot(fractions, curve[result.metric], style, label=label)
        ax_out.plot(fractions, curve["outliers_per_image"], style, label=label)
    ax_metric.set_xlabel("patches masked (%)")
    ax_metric.set_ylabel({"accuracy": "top-1 accuracy", "agreement": "top-1 agreement with unmasked"}.get(
        result.metric, "cosine of the pooled vector to unmasked"))
    ax_metric.set_ylim(-0.02 if result.metric != "pooled_cosine" else None, 1.02)
    if ax_metric.get_legend_handles_labels()[0]:
        ax_metric.legend(fontsize=8, loc="best", framealpha=0.7)  # one legend: both panels share the styles
    ax_out.set_xlabel("patches masked (%)")
    rule = result.params.get("threshold")
    ax_out.set_ylabel(f"outlier tokens / image (norm > {_counting_label(result.counting_threshold, rule)}, "
                      f"block {result.detect_layer})")
    fig.suptitle(f"{result.model}: masking probe (fill={result.fill}, reference={result.reference})")
    return fig


def pib_bars(result) -> Figure:
    """PiB bars with their bootstrap intervals: one bar (PiBResult) or one per row (SelectiveCLSResult)."""
    if isinstance(result, SelectiveCLSResult):
        rows = [r for r in result.rows if r["pib"] is not None]
        labels = [r["row"] for r in rows]
        values = [r["pib"] for r in rows]
        lows = [r["pib_ci_low"] for r in rows]
        highs = [r["pib_ci_high"] for r in rows]
    else:
        rows = [result] if result.pib is not None else []
        labels, values = [result.reference], [result.pib]
        lows, highs = [result.ci_low], [result.ci_high]
    if not rows:
        raise ValueError("no PiB to plot (no image passed the box filters)")
    values, lows, highs = (np.asarray(v, dtype=float) * 100 for v in (values, lows, highs))
    fig = Figure(figsize=(1.2 + 1.1 * len(labels), 3.2), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(labels))
    ax.bar(x, values, color="tab:blue", alpha=0.8)
    ax.errorbar(x, values, yerr=[values - lows, highs - values], fmt="none", ecolor="black", capsize=4)
    ax.set_xticks(x, labels)
    ax.set_ylabel(f"PiB (%), {100 * result.level:.0f} % bootstrap CI")
    ax.set_ylim(0, 100)
    ax.set_title(f"{result.model}: point in box (n={result.n_used})")
    return fig


def score_maps(result, n: int = 8, cols: int = 4, only_with_boxes: bool = True) -> Figure:
    """Per-image Patch Score maps with the (mapped) boxes drawn and the top-score patch marked.

    Args:
        result: a PatchScoreResult or a PiBResult with maps stored.
        n: images shown (the first ``n``; with ``only_with_boxes``, the first ``n`` that have a box).
    """
    if not result.maps:
        raise ValueError("this result holds no score maps (run with store_maps=True)")
    gh, gw = result.grid
    ph, pw = result.patch_size
    boxes = result.boxes_input or [[] for _ in result.ids]
    chosen = [i for i in range(len(result.ids)) if boxes[i] or not only_with_boxes] or list(range(len(result.ids)))
    chosen = chosen[:n]
    cols = min(cols, len(chosen))
    rows = math.ceil(len(chosen) / cols)
    fig = Figure(figsize=(2.6 * cols + 0.6, 2.6 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    shown = np.asarray([result.maps[i] for i in chosen], dtype=float)
    vmin, vmax = float(shown.min()), float(shown.max())  # one colour scale for all panels
    image = None
    for ax, i, scores in zip(axes, chosen, shown):
        image = ax.imshow(scores, cmap="viridis", vmin=vmin, vmax=vmax, extent=(0, gw, gh, 0))
        for x0, y0, x1, y1 in boxes[i]:
            ax.add_patch(Rectangle((x0 / pw, y0 / ph), (x1 - x0) / pw, (y1 - y0) / ph, fill=False,
                                   edgecolor="red", linewidth=1.5))
        top = int(result.top_patch[i])
        ax.plot(top % gw + 0.5, top // gw + 0.5, marker="x", color="white", markersize=8, mew=2)
        ax.set_title(Path(result.ids[i]).name, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[len(chosen):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=list(axes[:len(chosen)]), shrink=0.8, label="Patch Score")
    fig.suptitle(f"{result.model}: Patch Score maps (x = top patch, red = box)")
    return fig


# ------------------------------------------------------- makers for the registry's table (None: nothing to draw)
@figure(PiBResult, "pib")
@figure(SelectiveCLSResult, "pib")
def pib_bars_if_any(result) -> Optional[Figure]:
    """PiB bars, or None for a result without a PiB (no boxes) or a SelectiveCLS result without one."""
    if isinstance(result, SelectiveCLSResult):
        return pib_bars(result) if any(row.get("pib") is not None for row in result.rows) else None
    return pib_bars(result) if result.pib is not None else None


@figure(PiBResult, "score_maps", options=("n_maps",))
def score_maps_if_pib(result, n_maps: int = 8) -> Optional[Figure]:
    """The PiB result's score maps (the first ``n_maps`` images with a box), or None without a PiB."""
    return score_maps(result, n=n_maps) if result.pib is not None else None


@figure(PatchScoreResult, "score_maps", options=("n_maps",))
def score_maps_of_patch_score(result, n_maps: int = 8) -> Figure:
    """Patch Score maps of ``n_maps`` images: only the images with boxes when the result has foreground cells."""
    return score_maps(result, n=n_maps, only_with_boxes=result.fg is not None)


@figure(SelectiveCLSResult, "score_distributions")
def distributions_if_pib(result) -> Optional[Figure]:
    """A SelectiveCLS result's fg/bg score distributions, or None when no row has a PiB (no boxes)."""
    return score_distributions(result) if any(row.get("pib") is not None for row in result.rows) else None
