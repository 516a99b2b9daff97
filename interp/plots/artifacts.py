"""Figures of the artifact studies: high-norm tokens, register neurons, ablation, relocation and
test-time registers (SCIENCE.md sections 1-2).

Every function takes a study result (and optionally the images it was run on, for overlays) and returns a
``matplotlib.figure.Figure``; none recomputes a study. A result with nothing to show (no high-norm tokens,
no ranked neurons) gives a figure that says so instead of an error.

>>> fig = norm_profile(norms_study(source))
>>> fig.savefig("norm_profile.png", dpi=110, bbox_inches="tight")
>>> for name, fig in study_figures(result, images):     # every figure of one result
...     fig.savefig(f"{name}.png", dpi=110)
"""
from __future__ import annotations

import math
import textwrap
from pathlib import PurePath
from typing import List, Optional, Sequence, Tuple

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

MAX_PANELS = 8  # images drawn by the map figures (the first ones of the result)
NO_ARTIFACTS = "no high-norm tokens found"

ATTN_COLOR = "#1f77b4"
MLP_COLOR = "#d62728"
THRESHOLD_COLOR = "#2ca02c"
OUTLIER_RGBA = (1.0, 0.1, 0.1, 0.6)
TARGET_COLOR = "#00e5ff"


# ----------------------------------------------------------------------------------------- helpers
def message_figure(title: str, headline: str, detail: str = "") -> Figure:
    """A small figure with a title, a bold headline and a wrapped explanation (for empty results)."""
    fig = Figure(figsize=(7, 2.4), layout="constrained")
    ax = fig.add_subplot()
    ax.axis("off")
    ax.set_title(title, fontsize=11)
    ax.text(0.5, 0.68, headline, ha="center", va="center", fontsize=14, weight="bold", transform=ax.transAxes)
    if detail:
        ax.text(0.5, 0.3, textwrap.fill(detail, 90), ha="center", va="center", fontsize=9,
                transform=ax.transAxes)
    return fig


def short_name(image_id: str, width: int = 22) -> str:
    """The file stem of an image id, shortened to ``width`` characters."""
    stem = PurePath(str(image_id)).stem or str(image_id)
    return stem if len(stem) <= width else stem[:width - 1] + "\u2026"


def display_arrays(images, n: int) -> Optional[List[np.ndarray]]:
    """The first ``n`` images as [H, W, 3] float arrays in 0..1, from a Tensor[N, 3, H, W] (0..1) or PIL images.

    Returns None when ``images`` is None. Raises ValueError when fewer than ``n`` images are given.
    """
    if images is None:
        return None
    if hasattr(images, "detach") and hasattr(images, "dim"):  # a torch Tensor
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be a Tensor[N, 3, H, W] in 0..1, got shape {tuple(images.shape)}")
        arrays = [img.permute(1, 2, 0).detach().float().cpu().clamp(0, 1).numpy() for img in images[:n]]
    else:
        arrays = [np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in list(images)[:n]]
    if len(arrays) < n:
        raise ValueError(f"{len(arrays)} images given for a result over at least {n} images: pass the images "
                         "the study ran on, in the same order")
    return arrays


def _map_panel(ax, grid_map: np.ndarray, image: Optional[np.ndarray]) -> Tuple[float, float]:
    """Draw a 0/1 patch map [h, w] in red over ``image`` (or over a grey background). -> (width, height)."""
    h, w = grid_map.shape
    if image is not None:
        height, width = image.shape[:2]
        ax.imshow(image, extent=(0, width, height, 0), interpolation="bilinear")
    else:
        height, width = h, w
        ax.imshow(np.full((h, w, 3), 0.93), extent=(0, width, height, 0), interpolation="nearest")
    rgba = np.zeros((h, w, 4))
    rgba[grid_map.astype(bool)] = OUTLIER_RGBA
    ax.imshow(rgba, extent=(0, width, height, 0), interpolation="nearest")
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    return width, height


def _outline(ax, mask: np.ndarray, width: float, height: float, color: str = TARGET_COLOR) -> None:
    """Draw the boundary of a 0/1 patch mask [h, w] stretched over ``width`` x ``height`` pixels."""
    h, w = mask.shape
    sy, sx = height / h, width / w
    m = np.pad(mask.astype(bool), 1)
    segments = []
    for r in range(h):
        for c in range(w):
            if not m[r + 1, c + 1]:
                continue
            x0, x1, y0, y1 = c * sx, (c + 1) * sx, r * sy, (r + 1) * sy
            if not m[r, c + 1]:
                segments.append([(x0, y0), (x1, y0)])
            if not m[r + 2, c + 1]:
                segments.append([(x0, y1), (x1, y1)])
            if not m[r + 1, c]:
                segments.append([(x0, y0), (x0, y1)])
            if not m[r + 1, c + 2]:
                segments.append([(x1, y0), (x1, y1)])
    ax.add_collection(LineCollection(segments, colors=color, linewidths=1.6))


def _panel_grid(fig: Figure, n: int, max_cols: int = 4):
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return list(axes.flat[:n])


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}g}"


def _plain_log_axis(axis, lo: float, hi: float) -> None:
    """Log-scale axis ticks labelled as plain numbers (no 3x10^2 clutter): at 1, 2, 5 x 10^k, or denser when
    the axis spans [lo, hi] of about one decade or less."""
    wide = hi / max(lo, 1e-12) > 15
    subs = (1.0, 2.0, 5.0) if wide else (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _use_log(values: Sequence[float]) -> bool:
    vals = [v for v in values if v is not None and v > 0]
    return bool(vals) and max(vals) / min(vals) > 20


# ----------------------------------------------------------------------------------------- norms
def _rebinned_histograms(result, stage: str, target_bins: int = 120):
    """Dense [L, bins] patch-norm counts over the occupied norm range, with the coarse bin edges."""
    hists = result.histograms.get(stage) or []
    edges = np.asarray(result.hist_edges, dtype=np.float64)
    filled = [h for h in hists if h["counts"]]
    if not filled or edges.size < 2:
        return None, None
    lo = min(h["start"] for h in filled)
    hi = max(h["start"] + len(h["counts"]) for h in filled)
    n_fine = edges.size - 1
    span = max(int((hi - lo) * 1.1), target_bins)  # a margin; and at least ~0.27 decades, so a narrow
    # distribution still has a visible shape
    lo = max(0, min(lo - (span - (hi - lo)) // 2, n_fine - span))
    hi = min(n_fine, lo + span)
    factor = max(1, math.ceil((hi - lo) / target_bins))
    n_coarse = math.ceil((hi - lo) / factor)
    dense = np.zeros((len(hists), n_coarse * factor), np.int64)
    for i, h in enumerate(hists):
        counts = np.asarray(h["counts"], np.int64)
        a = h["start"] - lo
        dense[i, a:a + counts.size] = counts
    coarse = dense.reshape(len(hists), n_coarse, factor).sum(-1)
    coarse_edges = edges[lo:lo + n_coarse * factor + 1:factor]
    if coarse_edges.size < n_coarse + 1:  # the last coarse bin runs past the table: extend geometrically
        ratio = edges[1] / edges[0]
        coarse_edges = np.append(coarse_edges, coarse_edges[-1] * ratio ** factor)
    return coarse, coarse_edges


def norm_histograms(norms_result, stage: str = "resid_post") -> Figure:
    """Patch-token norm histograms of every layer (heat map layer x log-norm, colour = log count), and the
    detection layer's histogram with the outlier threshold."""
    r = norms_result
    counts, edges = _rebinned_histograms(r, stage)
    title = f"{r.model}: patch-token L2 norms per block ({stage}, {len(r.ids)} images)"
    if counts is None:
        return message_figure(title, "no norm histograms in this result", "the source held no patch tokens")
    n_layers = counts.shape[0]
    fig = Figure(figsize=(11, max(3.6, 0.28 * n_layers + 1.8)), layout="constrained")
    heat, hist = fig.subplots(1, 2, width_ratios=[1.6, 1])
    masked = np.ma.masked_equal(counts, 0)
    mesh = heat.pcolormesh(edges, np.arange(n_layers + 1) - 0.5, masked, cmap="viridis",
                           norm=LogNorm(vmin=1, vmax=max(int(counts.max()), 2)))
    heat.set_xscale("log")
    _plain_log_axis(heat.xaxis, edges[0], edges[-1])
    heat.set_xlabel("patch-token L2 norm (log scale)")
    heat.set_ylabel("block (output)")
    heat.set_yticks(range(n_layers))
    if n_layers > 16:
        heat.set_yticks(range(0, n_layers, max(1, n_layers // 12)))
    heat.set_title("all blocks", fontsize=10)
    fig.colorbar(mesh, ax=heat, label="patch tokens per bin (log)")
    d = r.detect_layer
    if r.threshold is not None:
        heat.axvline(r.threshold, color=THRESHOLD_COLOR, ls=":", lw=1)
        heat.plot([r.threshold, r.threshold], [d - 0.5, d + 0.5], color=THRESHOLD_COLOR, lw=3)
        heat.set_title(f"all blocks (green: threshold {r.threshold:.3g}, thick at detection block {d})",
                       fontsize=10)

    row = counts[d] if 0 <= d < n_layers else np.zeros(counts.shape[1])
    hist.stairs(np.maximum(row, 0.5), edges, fill=True, alpha=0.7, baseline=0.5)
    hist.set_xscale("log")
    _plain_log_axis(hist.xaxis, edges[0], edges[-1])
    hist.set_yscale("log")
    hist.set_ylim(bottom=0.5)
    hist.set_xlabel("patch-token L2 norm (log scale)")
    hist.set_ylabel("patch tokens per bin (log)")
    if r.threshold is not None:
        hist.axvline(r.threshold, color=THRESHOLD_COLOR, lw=2,
                     label=f"threshold {r.threshold:.3g} ({r.threshold_method})")
        hist.legend(fontsize=8)
        hist.set_title(f"detection block {d}: {100 * r.outlier_fraction:.2f} % of patches above")
    else:
        hist.set_title(f"detection block {d}: {NO_ARTIFACTS}")
        hist.text(0.5, 0.9, f"no separated high-norm mode (mode ratio {r.mode_ratio:.2f})", ha="center",
                  transform=hist.transAxes, fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig


def norm_profile(norms_result) -> Figure:
    """Max and median patch norm through every block, the attention step (-> resid_mid) and the MLP step
    (-> resid_post) drawn apart, the emergence step shaded, CLS->patch attention on a twin axis."""
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
            xs += [i + 0.5, i + 1.0]
            ys += [np.nan if values_mid[i] is None else values_mid[i],
                   np.nan if values_post[i] is None else values_post[i]]
        return np.array(xs), np.array(ys, dtype=float)

    fig = Figure(figsize=(max(7.5, 0.55 * n_layers + 3), 4.6), layout="constrained")
    ax = fig.add_subplot()
    handles = []
    for name, values, lw, marker in (("max", r.max_patch_norm, 2.2, "o"), ("median", r.median_patch_norm, 1.2, ".")):
        xs, ys = series(values["resid_mid"], values["resid_post"])
        # Segment k joins point k to k+1: odd k are attention steps (post of block i -> mid of block i+1).
        segs = [[(xs[k], ys[k]), (xs[k + 1], ys[k + 1])] for k in range(len(xs) - 1)]
        colors = [MLP_COLOR if k % 2 == 0 else ATTN_COLOR for k in range(len(segs))]
        ax.add_collection(LineCollection(segs, colors=colors, linewidths=lw))
        ax.plot(xs[0::2], ys[0::2], marker, color=ATTN_COLOR, ms=5 if name == "max" else 4, ls="none")
        ax.plot(xs[1::2], ys[1::2], marker, color=MLP_COLOR, ms=5 if name == "max" else 4, ls="none")
        handles.append(Line2D([], [], color="black", lw=lw, marker=marker, label=f"{name} patch norm"))
    handles += [Line2D([], [], color=ATTN_COLOR, lw=2, label="attention step (\u2192 resid_mid)"),
                Line2D([], [], color=MLP_COLOR, lw=2, label="MLP step (\u2192 resid_post)")]
    values = [v for v in list(mid) + list(post) + list(r.median_patch_norm.get("resid_mid") or [])
              if v is not None and v > 0]
    if _use_log(values):
        ax.set_yscale("log")
    ax.set_xlim(0, n_layers)
    lo, hi = min(values), max(values)
    ax.set_ylim(lo / 1.5 if ax.get_yscale() == "log" else 0, hi * (2 if ax.get_yscale() == "log" else 1.15))
    ax.set_xticks([i + 0.5 for i in range(n_layers)], [str(i) for i in range(n_layers)])
    for i in range(1, n_layers):
        ax.axvline(i, color="0.85", lw=0.8, zorder=0)
    ax.set_xlabel("block (left half: attention, right half: MLP)")
    ax.set_ylabel("patch-token L2 norm")
    if r.threshold is not None:
        ax.axhline(r.threshold, color=THRESHOLD_COLOR, ls=":", lw=1.2)
        handles.append(Line2D([], [], color=THRESHOLD_COLOR, ls=":",
                              label=f"threshold {r.threshold:.3g} (block {r.detect_layer})"))
    if r.emergence:
        layer, comp = r.emergence["layer"], r.emergence["component"]
        x0 = layer + (0.0 if comp == "attention" else 0.5)
        ratio = (r.emergence["attn_ratio"] if comp == "attention" else r.emergence["mlp_ratio"])[layer]
        ax.axvspan(x0, x0 + 0.5, color="gold", alpha=0.35, zorder=0)
        handles.append(Patch(color="gold", alpha=0.35,
                             label=f"emergence: block {layer} {comp} (max \u00d7{ratio:.1f})"))
    if r.cls_attention_max is not None:
        twin = ax.twinx()
        twin.plot([i + 0.25 for i in range(n_layers)], r.cls_attention_max, "x--", color="tab:purple", lw=1, ms=6)
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("max CLS\u2192patch attention (head mean, 0-1)", color="tab:purple")
        handles.append(Line2D([], [], color="tab:purple", marker="x", ls="--", label="max CLS\u2192patch attention"))
    ax.set_xlim(0, n_layers)  # after the twin axis, whose plot would widen the shared x range
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title + ("" if r.artifacts_found else f": {NO_ARTIFACTS}"), fontsize=11)
    return fig


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
    for i, ax in enumerate(_panel_grid(fig, n)):
        _map_panel(ax, maps[i], None if pictures is None else pictures[i])
        ax.set_title(f"{short_name(r.ids[i])}\n{int(maps[i].sum())} outlier patches", fontsize=9)
    shown = "" if n == len(r.ids) else f" (first {n} of {len(r.ids)} images)"
    thr = f"norm > {r.threshold:.3g}" if r.threshold is not None else "above threshold"
    fig.suptitle(f"{title}: red = {thr}{shown}", fontsize=11)
    return fig


# ----------------------------------------------------------------------------------------- neurons
def neuron_scores(neurons_result, max_bars: int = 30) -> Figure:
    """Bar charts of the ranked register neurons' scores and of each layer's best score."""
    r = neurons_result
    title = (f"{r.model}: register-neuron scores (detection block {r.detect_layer}, "
             f"{r.n_images_with_outliers} images with outliers)")
    if not r.neurons:
        return message_figure(title, "no register neurons ranked", r.message or NO_ARTIFACTS)
    top = r.neurons[:max_bars]
    fig = Figure(figsize=(11, max(3.6, 0.24 * len(top) + 1.6)), layout="constrained")
    bars, layers = fig.subplots(1, 2, width_ratios=[1, 1.2])
    labels = [f"L{e['layer']}:{e['neuron']}" for e in top]
    bars.barh(range(len(top)), [e["score"] for e in top], color="tab:orange")
    for y, e in enumerate(top):
        bars.text(e["score"], y, f" {e['score']:.3g}", va="center", fontsize=8)
    bars.set_xlim(0, max(e["score"] for e in top) * 1.15)
    bars.set_yticks(range(len(top)), labels, fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("score: mean |activation| on outlier patches")
    shown = "" if len(top) == len(r.neurons) else f" (first {len(top)})"
    bars.set_title(f"top {len(r.neurons)} neurons{shown} (block:neuron)", fontsize=10)

    scores = r.layer_max_score
    chosen = {e["layer"] for e in r.neurons}
    layers.bar(range(len(scores)), scores, color=["tab:orange" if i in chosen else "0.6" for i in range(len(scores))])
    layers.set_xticks(range(len(scores)))
    layers.set_xlabel(f"block (scored up to {r.highest_layer})")
    layers.set_ylabel("best neuron score (mean |activation|)")
    if _use_log(scores):
        layers.set_yscale("log")
    layers.set_title("best score per block (orange: holds ranked neurons)", fontsize=10)
    fig.suptitle(title, fontsize=11)
    return fig


# ----------------------------------------------------------------------------------------- ablation
ABLATION_METRICS = {
    "outlier_count": "patch tokens above threshold (all images)",
    "max_norm": "max patch-token L2 norm",
    "top1_agreement": "share of images with unchanged top-1 (0-1)",
    "accuracy": "top-1 accuracy (0-1)",
}


def ablation_bars(ablation_result) -> Figure:
    """Per metric: bars for the unablated baseline, the ablated target neurons, and the random controls
    (mean with a std error bar, each control as a dot)."""
    r = ablation_result
    n_target = sum(len(v) for v in r.neurons.values())
    n_controls = len(r.controls)
    title = (f"{r.model}: {r.mode}-ablation of {n_target} register neurons vs {n_controls} random same-block "
             f"controls ({r.n_images} images, block {r.detect_layer})")
    metrics = [m for m in ABLATION_METRICS if r.summary.get(m, {}).get("baseline") is not None]
    if not metrics:
        return message_figure(title, "no ablation measurements in this result")
    fig = Figure(figsize=(3.3 * len(metrics) + 0.5, 4.0), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        s = r.summary[metric]
        heights = [s["baseline"], s["target"], s["control_mean"] if s["control_mean"] is not None else np.nan]
        ax.bar(range(3), heights, color=["0.6", "tab:red", "tab:blue"], alpha=0.85)
        if s["control_std"] is not None:
            ax.errorbar(2, heights[2], yerr=s["control_std"], capsize=6, color="black", lw=1.2)
        points = [r.conditions[f"control_{i}"][metric] for i in range(n_controls)
                  if r.conditions.get(f"control_{i}", {}).get(metric) is not None]
        if points:
            jitter = np.linspace(-0.2, 0.2, len(points)) if len(points) > 1 else [0.0]
            ax.plot(2 + np.asarray(jitter), points, "o", color="black", ms=3.5, label="one control")
            ax.legend(fontsize=7, loc="lower right")
        for x, v in enumerate(heights):
            if v is not None and np.isfinite(v):
                top_of = max([v] + points) if x == 2 else v  # above the control dots
                ax.text(x, top_of * 1.02, _fmt(v), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(3), ["baseline", "register\nneurons", f"controls\n(mean\u00b1std)"], fontsize=8)
        ax.set_ylabel(ABLATION_METRICS[metric], fontsize=9)
        top = max([v for v in heights + points if v is not None and np.isfinite(v)] + [1e-9])
        ax.set_ylim(0, top * 1.18)
        ax.set_title(metric.replace("_", " "), fontsize=10)
    fig.suptitle(title, fontsize=10)
    return fig


# ----------------------------------------------------------------------------------------- relocation
def relocation_maps(relocation_result, images=None) -> Figure:
    """Outlier maps before (top row) and after (bottom row) relocation, the target mask outlined.

    Args:
        images: optional Tensor[N, 3, H, W] in 0..1 or PIL images, as in :func:`outlier_maps`.
    """
    r = relocation_result
    title = f"{r.model}: relocation of the register neurons onto a target (outlined), block {r.detect_layer}"
    if not r.ids:
        return message_figure(title, "no images in this result")
    n = min(len(r.ids), MAX_PANELS)
    pictures = display_arrays(images, n)
    target = np.asarray(r.target, dtype=bool)
    before = np.asarray(r.outlier_maps_before, dtype=np.int64)
    after = np.asarray(r.outlier_maps_after, dtype=np.int64)
    fig = Figure(figsize=(2.5 * n + 0.8, 5.8), layout="constrained")
    axes = fig.subplots(2, n, squeeze=False)
    for i in range(n):
        picture = None if pictures is None else pictures[i]
        for row, maps in ((0, before), (1, after)):
            ax = axes[row, i]
            width, height = _map_panel(ax, maps[i], picture)
            _outline(ax, target, width, height)
        axes[0, i].set_title(f"{short_name(r.ids[i])}\n{int(before[i].sum())} outliers before", fontsize=9)
        axes[1, i].set_title(f"after: {int(after[i].sum())} outliers, IoU {r.iou[i]:.2f}", fontsize=9)
    axes[0, 0].set_ylabel("before", fontsize=10)
    axes[1, 0].set_ylabel("after relocation", fontsize=10)
    active = "" if r.mean_iou_active is None else f", {r.mean_iou_active:.2f} on images with outliers before"
    shown = "" if n == len(r.ids) else f"; first {n} of {len(r.ids)} images"
    thr = "" if r.threshold is None else f", red = norm > {r.threshold:.3g}"
    fig.suptitle(f"{title}\nmean IoU with target {r.mean_iou:.2f}{active}{thr}{shown}", fontsize=10)
    return fig


# ----------------------------------------------------------------------------------------- registers
def register_summary(register_result) -> Figure:
    """Patch outliers and max patch norm without vs with the test-time register, and the register token's
    norm (per image), at the detection block; CLS attention on the register when measured."""
    r = register_result
    title = (f"{r.model}: test-time register ({r.n_registers} token, {sum(len(v) for v in r.neurons.values())} "
             f"neurons, block {r.detect_layer}, {len(r.ids)} images)")
    if not r.baseline or not r.with_register:
        return message_figure(title, "no measurements in this result")
    has_attention = bool(r.cls_attention_on_register)
    fig = Figure(figsize=(11 if has_attention else 8, 4.0), layout="constrained")
    axes = fig.subplots(1, 3 if has_attention else 2, width_ratios=[1, 1.5, 1][:3 if has_attention else 2])
    counts = [r.baseline["outlier_count"], r.with_register["outlier_count"]]
    ax = axes[0]
    ax.bar([0, 1], counts, color=["0.6", "tab:green"])
    for x, v in enumerate(counts):
        ax.text(x, v, str(v), ha="center", va="bottom", fontsize=9)
    ax.set_xticks([0, 1], ["without", "with register"])
    ax.set_ylabel("patch tokens above threshold (all images)")
    ax.set_ylim(0, max(counts + [1]) * 1.18)
    ax.set_title("high-norm patches", fontsize=10)

    ax = axes[1]
    reg = [v for v in r.register_norm if v is not None]
    heights = [r.baseline["max_patch_norm"], r.with_register["max_patch_norm"], max(reg) if reg else np.nan]
    ax.bar([0, 1, 2], heights, color=["0.6", "tab:green", "tab:purple"], alpha=0.85)
    if reg:
        jitter = np.linspace(-0.2, 0.2, len(reg)) if len(reg) > 1 else [0.0]
        ax.plot(2 + np.asarray(jitter), reg, "o", color="black", ms=3.5, label="register norm, one image")
    if r.threshold is not None:
        ax.axhline(r.threshold, color=THRESHOLD_COLOR, ls=":", label=f"threshold {r.threshold:.3g}")
    ax.legend(fontsize=7, loc="upper left")
    for x, v in enumerate(heights):
        if np.isfinite(v):
            ax.text(x, v, _fmt(v), ha="center", va="bottom", fontsize=8)
    ax.set_xticks([0, 1, 2], ["max patch\nwithout", "max patch\nwith register",
                              "register token\n(max, dots: per image)"], fontsize=8)
    if _use_log(heights + reg):
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, max([v for v in heights + reg if np.isfinite(v)] + [1e-9]) * 1.2)
    ax.set_ylabel(f"L2 norm at block {r.detect_layer}")
    ax.set_title("where the high norm goes", fontsize=10)

    if has_attention:
        ax = axes[2]
        att = r.cls_attention_on_register
        ax.bar([0], [float(np.mean(att))], color="tab:purple", alpha=0.6)
        jitter = np.linspace(-0.2, 0.2, len(att)) if len(att) > 1 else [0.0]
        ax.plot(np.asarray(jitter), att, "o", color="black", ms=3.5)
        ax.set_xticks([0], ["mean (dots: per image)"], fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("CLS attention on register, last block (0-1)")
        ax.set_title("attention sink", fontsize=10)
    agree = r.with_register.get("top1_agreement")
    fig.suptitle(title + ("" if agree is None else f"\ntop-1 unchanged on {100 * agree:.0f} % of images"), fontsize=10)
    return fig


# ----------------------------------------------------------------------------------------- dispatch
def study_figures(result, images=None) -> List[Tuple[str, Figure]]:
    """Every figure of one artifact-study result as (file stem, Figure) pairs, e.g. for ``write_outputs``.

    Args:
        images: for the map figures, the images the study ran on (Tensor[N, 3, H, W] in 0..1 or PIL list).
    """
    study = getattr(result, "study", None)
    if study == "norms":
        return [("norm_profile", norm_profile(result)), ("norm_histograms", norm_histograms(result)),
                ("outlier_maps", outlier_maps(result, images))]
    if study == "neurons":
        return [("neuron_scores", neuron_scores(result))]
    if study == "ablate":
        return [("ablation_bars", ablation_bars(result))]
    if study == "relocate":
        return [("relocation_maps", relocation_maps(result, images))]
    if study == "registers":
        return [("register_summary", register_summary(result))]
    raise ValueError(f"no artifact figures for a {study!r} result (expected norms, neurons, ablate, relocate, "
                     "registers)")
