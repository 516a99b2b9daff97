"""Figures of the causal toolkit (docs/causal.md): the logit lens and the direct logit attribution, and the block x
position maps of activation and attribution patching, drawn on the patch grid.

>>> from interp.studies import open_source
>>> from interp.studies.causal.patching import patching_study
>>> two = open_source(model=model, images=images[:2])
>>> fig = patching_maps(patching_study(two, site="mlp_out", blocks=(2,), metric="outliers", progress=False))
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
from matplotlib.figure import Figure

from ..studies.causal.attribution import AttributionResult
from ..studies.causal.logit_lens import LogitLensResult
from ..studies.causal.patching import PatchingResult
from ..studies.causal.rollout import RolloutResult
from .common import ATTN_COLOR, MLP_COLOR, message_figure, short_name
from .registry import figure

MAX_ROWS = 12  # block maps drawn per figure (the first ones)


def _symmetric(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0


def _grid_maps(fig: Figure, maps: List[np.ndarray], titles: List[str], label: str, symmetric: bool) -> None:
    """One image map per entry (each [gh, gw]) on a shared colour scale, with one colour bar."""
    maps, titles = maps[:MAX_ROWS], titles[:MAX_ROWS]
    cols = min(len(maps), 6)
    rows = -(-len(maps) // cols)
    axes = fig.subplots(rows, cols, squeeze=False)
    stacked = np.stack(maps)
    if symmetric:
        lim = _symmetric(stacked)
        vmin, vmax, cmap = -lim, lim, "RdBu_r"
    else:
        finite = stacked[np.isfinite(stacked)]
        vmin, vmax, cmap = (float(finite.min()), float(finite.max()), "viridis") if finite.size else (0, 1, "viridis")
    image = None
    for ax, grid_map, title in zip(axes.flat, maps, titles):
        image = ax.imshow(grid_map, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_title(title, fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([]), ax.set_yticks([])
    for ax in list(axes.flat)[len(maps):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, shrink=0.8, label=label)


@figure(LogitLensResult, "logit_lens")
def logit_lens(result) -> Figure:
    """The pooled read of every block, and each block's patch tokens read through the head on the patch grid."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[1, 2])
    ax = left.subplots()
    ax.plot(range(len(result.rows)), result.lens_pooled, marker="o", color=ATTN_COLOR, label="pooled read")
    if result.lens_top1 is not None:
        ax.plot(range(len(result.rows)), result.lens_top1, marker="s", color=MLP_COLOR, label="top-1 = final")
    ax.set_xticks(range(len(result.rows)), result.rows, rotation=60, fontsize=7)
    ax.set_ylabel(result.metric)
    ax.legend(fontsize=8)
    ax.set_title(f"{short_name(result.model, 30)}: logit lens", fontsize=10)
    _grid_maps(right, [np.asarray(m, dtype=float) for m in result.lens_maps], result.rows,
               f"patch token read ({result.metric})", symmetric=False)
    return fig


@figure(LogitLensResult, "logit_attribution")
def logit_attribution(result) -> Figure:
    """The direct contribution of the embedding and each block's attention and MLP, and per head."""
    title = f"{short_name(result.model, 30)}: direct logit attribution"
    if result.dla is None:
        return message_figure(title, "no logit to decompose", "; ".join(result.notes))
    heads = result.dla.get("heads")
    fig = Figure(figsize=(11 if heads else 7, 4), layout="constrained")
    axes = fig.subplots(1, 2 if heads else 1, squeeze=False)[0]
    names, values = result.dla["components"], result.dla["mean"]
    colors = [MLP_COLOR if n.endswith("mlp") else ATTN_COLOR for n in names]
    axes[0].bar(range(len(values)), values, color=colors)
    axes[0].set_xticks(range(len(names)), names, rotation=70, fontsize=7)
    axes[0].axhline(0, color="black", linewidth=0.5)
    axes[0].set_ylabel("contribution (mean over images)")
    axes[0].set_title(f"{title}\noutput {result.dla['output']:.3g} = sum + bias {result.dla['bias']:.3g}", fontsize=9)
    if heads:
        table = np.asarray(heads, dtype=float)
        lim = _symmetric(table)
        image = axes[1].imshow(table, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        axes[1].set_xlabel("head"), axes[1].set_ylabel("block")
        axes[1].set_title("per head", fontsize=9)
        fig.colorbar(image, ax=axes[1])
    return fig


def _sweep_title(result) -> str:
    return (f"{short_name(result.model, 24)}: {result.study} of {result.site} ({result.direction}, "
            f"{result.corruption}), {result.metric}")


def _cell_table(result, values: List[List[float]], label: str) -> Figure:
    """Block x cell heatmap (heads, neurons; or tokens of blocks with different grids)."""
    fig = Figure(figsize=(8, 0.5 + 0.35 * len(values) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    width = max(len(row) for row in values)
    table = np.full((len(values), width), np.nan)
    for i, row in enumerate(values):
        table[i, :len(row)] = row
    lim = _symmetric(table)
    image = ax.imshow(table, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(values)), result.block_labels, fontsize=7)
    if width <= 24:
        ax.set_xticks(range(width), result.cells[0][:width] if len(result.cells[0]) == width else range(width),
                      rotation=60, fontsize=7)
    ax.set_xlabel(result.cell_kind)
    ax.set_title(_sweep_title(result), fontsize=9)
    fig.colorbar(image, ax=ax, label=label)
    return fig


def sweep_maps(result, values: List[List[float]], label: str) -> Figure:
    """Token sweeps: each block's effects on its patch grid (prefix tokens in the panel titles); other sweeps:
    the block x cell table."""
    if result.cell_kind != "token":
        return _cell_table(result, values, label)
    maps, titles = [], []
    for row, lay, name in zip(values, result.layouts, result.block_labels):
        gh, gw = lay["grid"]
        k = lay["n_prefix"]
        if len(row) != k + gh * gw:
            return _cell_table(result, values, label)
        maps.append(np.asarray(row[k:], dtype=float).reshape(gh, gw))
        prefix = ", ".join(f"{v:.2g}" for v in row[:k])
        titles.append(f"{name}" + (f"\nprefix {prefix}" if k else ""))
    fig = Figure(figsize=(11, 2.2 * (-(-min(len(maps), MAX_ROWS) // 6)) + 1.2), layout="constrained")
    fig.suptitle(_sweep_title(result), fontsize=9)
    _grid_maps(fig, maps, titles, label, symmetric=True)
    return fig


@figure(PatchingResult, "patching_maps")
def patching_maps(result) -> Figure:
    """The normalised effect of patching each cell: block x position maps on the patch grid."""
    return sweep_maps(result, result.normalized, "normalised effect")


def attention_check(result) -> Optional[Figure]:
    """Per block, the rank correlation of the clean CLS attention to a patch with the patch's effect; None for
    a sweep without it (heads, neurons, no CLS token)."""
    if not result.attention_rank:
        return None
    fig = Figure(figsize=(6.4, 3.4), layout="constrained")
    ax = fig.add_subplot()
    ranks = [np.nan if r is None else r for r in result.attention_rank]
    ax.bar(range(len(ranks)), ranks, color=ATTN_COLOR)
    for i, r in enumerate(result.attention_rank):
        if r is None:
            ax.text(i, 0, "no effect", rotation=90, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(ranks)), result.block_labels, rotation=60, fontsize=7)
    ax.set_ylim(-1, 1)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_ylabel("Spearman: CLS attention vs effect")
    ax.set_title(f"{_sweep_title(result)}\ndoes attention to a patch predict its effect?", fontsize=8)
    return fig


figure(PatchingResult, "attention_check")(attention_check)
figure(AttributionResult, "attention_check")(attention_check)


@figure(AttributionResult, "attribution_maps")
def attribution_maps(result) -> Figure:
    """The first-order estimate of each cell's normalised effect, drawn as the patching maps are."""
    return sweep_maps(result, result.normalized, "estimated normalised effect")


@figure(AttributionResult, "attribution_vs_patching")
def attribution_vs_patching(result) -> Optional[Figure]:
    """Each cell's estimate against its real patching effect, with their correlation; None without ``compare``."""
    if result.patched_normalized is None:
        return None
    est = np.asarray([v for row in result.normalized for v in row], dtype=float)
    real = np.asarray([v for row in result.patched_normalized for v in row], dtype=float)
    fig = Figure(figsize=(4.8, 4.4), layout="constrained")
    ax = fig.add_subplot()
    ax.scatter(real, est, s=10, color=ATTN_COLOR)
    finite = np.concatenate([real[np.isfinite(real)], est[np.isfinite(est)]])
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        ax.plot([lo, hi], [lo, hi], color="grey", linestyle=":", linewidth=1)
    corr = "n/a" if result.correlation is None else f"{result.correlation:.3f}"
    ax.set_xlabel("activation patching (normalised)")
    ax.set_ylabel("attribution patching (normalised)")
    ax.set_title(f"{_sweep_title(result)}\nPearson r = {corr}", fontsize=8)
    return fig


@figure(RolloutResult, "rollout_maps")
def rollout_maps(result) -> Figure:
    """The CLS row of the rollout (and of the relevance) on the patch grid, mean over images; the prefix
    columns (CLS itself, registers) in the titles."""
    maps, titles = [np.asarray(result.rollout_map, dtype=float)], ["rollout"]
    prefixes = [result.rollout_prefix]
    if result.relevance_map is not None:
        maps.append(np.asarray(result.relevance_map, dtype=float))
        titles.append("relevance")
        prefixes.append(result.relevance_prefix)
    fig = Figure(figsize=(3.6 * len(maps), 3.6), layout="constrained")
    axes = fig.subplots(1, len(maps), squeeze=False)[0]
    for ax, grid_map, title, prefix in zip(axes, maps, titles, prefixes):
        image = ax.imshow(grid_map, cmap="viridis", interpolation="nearest")
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_title(f"{title}\nprefix " + ", ".join(f"{v:.2g}" for v in prefix), fontsize=8)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"{short_name(result.model, 30)}: CLS row from block {result.start_layer}", fontsize=9)
    return fig
