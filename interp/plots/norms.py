"""Figures of the norms study (docs/methods.md section 1): norm distributions per block, the norm profile with the
attention and MLP steps drawn apart, and outlier maps over the images.

>>> from interp.studies.artifacts.norms import norms_study
>>> fig = norm_profile(norms_study(source, progress=False)); fig.savefig("norm_profile.png", dpi=110, bbox_inches="tight")
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .common import (MAX_PANELS, NO_ARTIFACTS, ATTN_COLOR, MLP_COLOR, THRESHOLD_COLOR, message_figure, short_name,
                     display_arrays, outline_legend, plural, _map_panel, _panel_grid, _plain_log_axis, _use_log)
from ..studies.artifacts.norms import NormsResult
from .registry import figure


QUANTILES = (0.01, 0.25, 0.5, 0.75, 0.99)  # per block: the 1-99 % line, (quartiles), the median tick


def _block_quantiles(result, stage: str):
    """Per block: the patch-norm quantiles of :data:`QUANTILES`, min, max and token count, read from the
    result's log-binned histograms (~0.5 % wide bins, so a quantile is exact to about 0.5 %).

    Returns:
        (quantiles [L, len(QUANTILES)], lo [L], hi [L], totals [L]); NaN rows for blocks without tokens;
        None when the result holds no histogram.
    """
    hists = result.histograms.get(stage) or []
    edges = np.asarray(result.hist_edges, dtype=np.float64)
    if not any(h["counts"] for h in hists) or edges.size < 2:
        return None
    centres = np.sqrt(edges[:-1] * edges[1:])
    n = len(hists)
    quantiles, lo, hi, totals = np.full((n, len(QUANTILES)), np.nan), np.full(n, np.nan), np.full(n, np.nan), np.zeros(n)
    for i, h in enumerate(hists):
        counts = np.asarray(h["counts"], dtype=np.float64)
        if not counts.sum():
            continue
        cum = np.cumsum(counts)
        totals[i] = cum[-1]
        idx = np.minimum(np.searchsorted(cum, np.asarray(QUANTILES) * cum[-1]), counts.size - 1)
        quantiles[i] = centres[h["start"] + idx]
        lo[i], hi[i] = edges[h["start"]], edges[min(h["start"] + counts.size, edges.size - 1)]
    return quantiles, lo, hi, totals


def _survival(result, stage: str, layer: int):
    """Share of the block's patch tokens with a norm >= x: (x [k], share [k]) at the histogram's bin edges."""
    hists = result.histograms.get(stage) or []
    if not 0 <= layer < len(hists) or not hists[layer]["counts"]:
        return None, None
    h, edges = hists[layer], np.asarray(result.hist_edges, dtype=np.float64)
    counts = np.asarray(h["counts"], dtype=np.float64)
    above = np.cumsum(counts[::-1])[::-1] / counts.sum()  # share at or above each bin's lower edge
    return edges[h["start"]:h["start"] + counts.size + 1], np.append(above, above[-1])


def _ridges(result, stage: str, span, n_points: int = 240):
    """Smoothed patch-norm densities per block on a log axis: (x [n_points], heights [L, n_points] in 0..1).

    Each row is a Gaussian kernel density over log10(norm) built from the histogram (bandwidth shrinking with
    the token count, 0.75/sqrt(n) of the span, kept between 1/300 and 1/40 of it: a handful of tokens gives
    smooth bumps, not a barcode), shown as sqrt(density / row max) so a small high-norm mode stays visible.
    """
    hists = result.histograms.get(stage) or []
    centres = np.log10(np.sqrt(np.asarray(result.hist_edges[:-1]) * np.asarray(result.hist_edges[1:])))
    grid = np.linspace(np.log10(span[0]), np.log10(span[1]), n_points)
    width = grid[-1] - grid[0]
    heights = np.zeros((len(hists), n_points))
    for i, h in enumerate(hists):
        counts = np.asarray(h["counts"], dtype=np.float64)
        if not counts.sum():
            continue
        keep = counts > 0
        where = centres[h["start"]:h["start"] + counts.size][keep]
        bandwidth = width * min(1 / 40, max(1 / 300, 0.75 / np.sqrt(counts.sum())))
        density = (counts[keep][None, :] * np.exp(-0.5 * ((grid[:, None] - where[None, :]) / bandwidth) ** 2)).sum(1)
        heights[i] = np.sqrt(density / density.max())
    return 10 ** grid, heights


@figure(NormsResult, "norm_profile")
def norm_profile(norms_result) -> Figure:
    """Max and median patch norm through every block: per block (one tick each) the value after its attention
    step (circle, -> resid_mid) and after its MLP step (square, -> resid_post), the steps coloured apart, the
    emergence step shaded, CLS->patch attention of each block's attention on a twin axis.

    Long on purpose: it is one figure's layout, axis by axis, with nothing that another figure shares."""
    r = norms_result
    title = f"{r.model}: patch-token norm through the network ({len(r.ids)} images)"
    mid = r.max_patch_norm.get("resid_mid") or []
    post = r.max_patch_norm.get("resid_post") or []
    if not mid or not post:
        return message_figure(title, "no per-layer norms in this result")
    n_layers = len(post)

    def series(values_mid, values_post):
        xs, ys = [], []
        for i in range(n_layers):
            xs += [i + AFTER_ATTN, i + AFTER_MLP]
            ys += [np.nan if values_mid[i] is None else values_mid[i],
                   np.nan if values_post[i] is None else values_post[i]]
        return np.array(xs), np.array(ys, dtype=float)

    fig = Figure(figsize=(max(7.5, 0.55 * n_layers + 3), 4.8), layout="constrained")
    ax = fig.add_subplot()
    handles = []
    for name, values, lw, size in (("max", r.max_patch_norm, 2.2, 6), ("median", r.median_patch_norm, 1.2, 3.5)):
        xs, ys = series(values["resid_mid"], values["resid_post"])
        # Segment k joins point k to k+1: even k are MLP steps (mid -> post of block i), odd k attention steps.
        segs = [[(xs[k], ys[k]), (xs[k + 1], ys[k + 1])] for k in range(len(xs) - 1)]
        colors = [MLP_COLOR if k % 2 == 0 else ATTN_COLOR for k in range(len(segs))]
        ax.add_collection(LineCollection(segs, colors=colors, linewidths=lw))
        ax.plot(xs[0::2], ys[0::2], "o", color=ATTN_COLOR, ms=size, ls="none")
        ax.plot(xs[1::2], ys[1::2], "s", color=MLP_COLOR, ms=size, ls="none")
        handles.append(Line2D([], [], color="black", lw=lw, label=f"{name} patch norm"))
    handles += [Line2D([], [], color=ATTN_COLOR, lw=2, marker="o", label="after attention (resid_mid)"),
                Line2D([], [], color=MLP_COLOR, lw=2, marker="s", label="after MLP (resid_post)")]
    values = [v for v in list(mid) + list(post) + list(r.median_patch_norm.get("resid_mid") or [])
              if v is not None and v > 0]
    if _use_log(values):
        ax.set_yscale("log")
    lo, hi = min(values), max(values)
    ax.set_ylim(lo / 1.5 if ax.get_yscale() == "log" else 0, hi * (2 if ax.get_yscale() == "log" else 1.15))
    step = 1 if n_layers <= 32 else max(1, n_layers // 24)
    ax.set_xticks(range(0, n_layers, step))
    for i in range(n_layers - 1):
        ax.axvline(i + 0.5, color="0.85", lw=0.8, zorder=0)  # block boundaries
    ax.set_xlabel("block (in each block: after attention ●, then after MLP ■)")
    ax.set_ylabel("patch-token L2 norm")
    if r.threshold is not None:
        ax.axhline(r.threshold, color=THRESHOLD_COLOR, ls=":", lw=1.2)
        handles.append(Line2D([], [], color=THRESHOLD_COLOR, ls=":",
                              label=f"threshold {r.threshold:.3g} (block {r.detect_layer})"))
    if r.emergence:
        layer, comp = r.emergence["layer"], r.emergence["component"]
        # the shaded step: from the point before it to the point it ends on
        x0, x1 = (layer - 1 + AFTER_MLP, layer + AFTER_ATTN) if comp == "attention" else \
            (layer + AFTER_ATTN, layer + AFTER_MLP)
        ratio = r.emergence["jump"]  # the max/median patch norm ratio's jump at that step
        ax.axvspan(max(x0, -0.5), x1, color="gold", alpha=0.35, zorder=0)
        handles.append(Patch(color="gold", alpha=0.35,
                             label=f"emergence: block {layer} {comp} step (max/median \u00d7{ratio:.1f})"))
    found = getattr(r, "emergence_detected", None)  # results saved before the field existed lack it
    if found:
        x = found["layer"] + (AFTER_ATTN if found["component"] == "attention" else AFTER_MLP)
        ax.axvline(x, color="tab:green", ls="--", lw=1.2, zorder=1)
        handles.append(Line2D([], [], color="tab:green", ls="--",
                              label=f"detected tokens separate: block {found['layer']} {found['component']} "
                                    f"(D {found['separation']:.1f}, \u00d7{found['ratio']:.1f})"))
    if r.cls_attention_max is not None:
        twin = ax.twinx()
        twin.plot([i + AFTER_ATTN for i in range(n_layers)], r.cls_attention_max, "x--", color="tab:purple", lw=1,
                  ms=6)
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("max CLS\u2192patch attention (head mean, 0-1)", color="tab:purple")
        handles.append(Line2D([], [], color="tab:purple", marker="x", ls="--",
                              label="max CLS\u2192patch attention (in the block's attention)"))
    ax.set_xlim(-0.5, n_layers - 0.5)  # after the twin axis, whose plot would widen the shared x range
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title + ("" if r.artifacts_found else f": {NO_ARTIFACTS}"), fontsize=11)
    return fig


@figure(NormsResult, "norm_histograms")
def norm_histograms(norms_result, stage: str = "resid_post") -> Figure:
    """Patch-token norm distributions in a form that reads the same for 4 and for 50,000 images.
    (Long on purpose: one figure's layout, panel by panel; the arithmetic lives in the helpers.)

    Left: one ridge per block on a log norm axis (a smoothed density, see :func:`_ridges`; a line under it
    spans 1-99 % of the tokens, a tick marks the median; right-hand labels: share of patch tokens above the
    threshold). Right: the detection block's
    survival curve (share of patch tokens with a norm >= x, log-log), where the high-norm mode is a shoulder
    and the threshold a vertical line. Legends sit below the axes, never over data.
    """
    r = norms_result
    stats = _block_quantiles(r, stage)
    title = f"{r.model}: patch-token L2 norms per block ({stage}, {len(r.ids)} images)"
    if stats is None:
        return message_figure(title, "no norm histograms in this result", "the source held no patch tokens")
    quantiles, lo, hi, totals = stats
    n_layers = quantiles.shape[0]
    fig = Figure(figsize=(11, max(3.8, 0.3 * n_layers + 2.2)), layout="constrained")
    strip, tail = fig.subplots(1, 2, width_ratios=[1.5, 1])
    ys = np.arange(n_layers)
    span = (np.nanmin(lo) / 1.15, np.nanmax(hi) * 1.15)
    xs_ridge, heights = _ridges(r, stage, span)
    for i in range(n_layers):
        top = i + 0.45 - 0.9 * heights[i]  # rows grow upwards on an inverted y axis
        strip.fill_between(xs_ridge, i + 0.45, top, color=ATTN_COLOR, alpha=0.45, lw=0)
        strip.plot(xs_ridge, top, color=ATTN_COLOR, lw=1)
    strip.hlines(ys + 0.45, quantiles[:, 0], quantiles[:, 4], color="black", lw=1)
    strip.plot(quantiles[:, 2], ys + 0.3, "|", color="black", ms=9, mew=2)
    strip.set_xscale("log")
    strip.set_xlim(*span)
    _plain_log_axis(strip.xaxis, *span)
    strip.set_xlabel("patch-token L2 norm (log scale)")
    strip.set_ylabel("block (output)")
    strip.set_yticks(ys if n_layers <= 16 else ys[::max(1, n_layers // 12)])
    strip.set_ylim(n_layers - 0.5, -0.5)
    low, high = int(np.nanmin(totals)), int(np.nanmax(totals))  # a pyramid's stages hold fewer tokens each
    strip.set_title(f"every block ({high} patch tokens each)" if low == high else
                    f"every block ({high} patch tokens in the first stage, down to {low})", fontsize=10)
    handles = [Patch(facecolor=ATTN_COLOR, alpha=0.45, edgecolor=ATTN_COLOR,
                     label="token density (height \u221d \u221a, per block)"),
               Line2D([], [], color="black", lw=1, label="1-99 % of tokens"),
               Line2D([], [], color="black", marker="|", ls="none", ms=9, mew=2, label="median")]
    d = r.detect_layer
    if r.threshold is not None:
        strip.axvline(r.threshold, color=THRESHOLD_COLOR, ls=":", lw=1.5)
        shares = list(r.outlier_fraction_per_layer)
        if len(shares) == n_layers:
            right = strip.secondary_yaxis("right")
            right.set_yticks(strip.get_yticks(), [f"{100 * shares[int(i)]:.1f} %" for i in strip.get_yticks()],
                             fontsize=8)
            right.set_ylabel("patch tokens above threshold", fontsize=9)
        handles.append(Line2D([], [], color=THRESHOLD_COLOR, ls=":", lw=1.5,
                              label=f"threshold {r.threshold:.3g} ({r.threshold_method}, block {d})"))

    xs, share = _survival(r, stage, d)
    if xs is not None:
        tail.step(xs, share, where="post", color=ATTN_COLOR, lw=1.8)
        tail.set_xscale("log")
        tail.set_yscale("log")
        tail.set_xlim(*span)
        _plain_log_axis(tail.xaxis, *span)
        tail.set_ylim(0.5 / totals[d], 1.5)
    tail.set_xlabel("patch-token L2 norm x (log scale)")
    tail.set_ylabel("share of patch tokens with norm \u2265 x")
    if r.threshold is not None:
        tail.axvline(r.threshold, color=THRESHOLD_COLOR, ls=":", lw=1.5)
        tail.axhline(max(r.outlier_fraction, 0.5 / max(totals[d], 1)), color=THRESHOLD_COLOR, lw=0.8, alpha=0.6)
        tail.set_title(f"detection block {d}: {100 * r.outlier_fraction:.2f} % of patch tokens above", fontsize=10)
    else:
        tail.set_title(f"detection block {d}: {NO_ARTIFACTS}\n(no separated high-norm mode, mode ratio "
                       f"{r.mode_ratio:.2f})", fontsize=10)
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    return fig


# x offsets inside block i's column [i - 0.5, i + 0.5]: the value after its attention step, after its MLP step
AFTER_ATTN, AFTER_MLP = -0.2, 0.2


@figure(NormsResult, "outlier_maps", images=True)
def outlier_maps(norms_result, images=None) -> Figure:
    """Outlier (high-norm) patches at the detection block for the first images, over the images if given.

    Args:
        images: the images the study ran on, in order: a Tensor[N, 3, H, W] in 0..1 or PIL images (what the
            model saw, i.e. after resize and crop). The patch map is stretched over each image.
    """
    r = norms_result
    title = f"{r.model}: high-norm patches at block {r.detect_layer}"
    maps = np.asarray(r.outlier_maps, dtype=np.int64)
    if maps.size == 0 or not maps.any():
        why = (f"threshold {r.threshold:.3g} ({r.threshold_method}): no patch above it" if r.threshold is not None
               else f"the block-{r.detect_layer} norm distribution has no separated high-norm mode "
                    f"(upper/lower mode ratio {r.mode_ratio:.2f})")
        return message_figure(title, NO_ARTIFACTS, f"{len(r.ids)} images; {why}.")
    n = min(len(r.ids), MAX_PANELS)
    pictures = display_arrays(images, n)
    cols = min(n, 4)
    fig = Figure(figsize=(2.7 * cols, 2.9 * math.ceil(n / cols) + 0.5), layout="constrained")
    colors = []
    for i, ax in enumerate(_panel_grid(fig, n)):
        colors.append(_map_panel(ax, maps[i], None if pictures is None else pictures[i])[2])
        ax.set_title(f"{short_name(r.ids[i])}\n{plural(int(maps[i].sum()), 'outlier patch')}", fontsize=9)
    shown = "" if n == len(r.ids) else f" (first {n} of {len(r.ids)} images)"
    thr = f"norm > {r.threshold:.3g}" if r.threshold is not None else "above threshold"
    outline_legend(fig, colors, f"outlier patch: {thr}")
    fig.suptitle(f"{title}: outlined and tinted = {thr}{shown}", fontsize=11)
    return fig
