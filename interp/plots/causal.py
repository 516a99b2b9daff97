"""Figures of the register-neuron and causal studies (docs/methods.md section 2): neuron scores, ablation
against random controls, relocation maps and the test-time register summary."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .common import (MAX_PANELS, NO_ARTIFACTS, TARGET_COLOR, THRESHOLD_COLOR, message_figure, short_name,
                     display_arrays, near_one, outline_legend, plural, _map_panel, _outline, _fmt, _use_log)
from ..studies.artifacts.ablate import AblateResult
from ..studies.artifacts.neurons import NeuronsResult
from ..studies.artifacts.registers import RegistersResult
from ..studies.artifacts.relocate import RelocateResult
from .registry import figure


@figure(NeuronsResult, "neuron_scores")
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
    labels = [f"block {e['layer']}, neuron {e['neuron']}" for e in top]  # "L2:17" read like an L2 norm
    bars.barh(range(len(top)), [e["score"] for e in top], color="tab:orange")
    for y, e in enumerate(top):
        bars.text(e["score"], y, f" {e['score']:.3g}", va="center", fontsize=8)
    bars.set_xlim(0, max(e["score"] for e in top) * 1.15)
    bars.set_yticks(range(len(top)), labels, fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("score: mean |activation| on outlier patches")
    shown = "" if len(top) == len(r.neurons) else f" (first {len(top)})"
    bars.set_title(f"top {len(r.neurons)} neurons{shown}", fontsize=10)

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


def _bar_label(ax, x: float, value: float, above: float, cosine: bool = False) -> None:
    """The bar's value written a few points above ``above`` (its top, or the highest dot drawn on it), so the
    text never sits on a marker, on a linear or a log axis alike (a ``cosine`` with the digits that differ
    from 1)."""
    ax.annotate(near_one(value, gap=False) if cosine else _fmt(value), (x, above), xytext=(0, 5),
                textcoords="offset points", ha="center", va="bottom", fontsize=8)


# ----------------------------------------------------------------------------------------- ablation
ABLATION_METRICS = {
    "outlier_count": "patch tokens above threshold (all images)",
    "max_norm": "max patch-token L2 norm",
    "top1_agreement": "share of images with unchanged top-1 (0-1)",
    "accuracy": "top-1 accuracy (0-1)",
    "pooled_cosine": "cosine of the pooled vector to the unablated one",  # shown when there are no class logits
}


@figure(AblateResult, "ablation_bars")
def ablation_bars(ablation_result) -> Figure:
    """Per metric: bars for the unablated baseline, the ablated target neurons, and the random controls
    (mean with a std error bar, each control as a dot)."""
    r = ablation_result
    n_target = sum(len(v) for v in r.neurons.values())
    n_controls = len(r.controls)
    units = (f"{len(r.features)} SAE features vs {n_controls} random live-feature"
             if r.features else f"{n_target} register neurons vs {n_controls} random same-block")
    title = f"{r.model}: {r.mode}-ablation of {units} controls ({r.n_images} images, block {r.detect_layer})"
    metrics = [m for m in ABLATION_METRICS if r.summary.get(m, {}).get("baseline") is not None]
    if "top1_agreement" in metrics and "pooled_cosine" in metrics:
        metrics.remove("pooled_cosine")
    if not metrics:
        return message_figure(title, "no ablation measurements in this result")
    fig = Figure(figsize=(3.3 * len(metrics) + 0.5, 4.0), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    target_label = "SAE\nfeatures" if r.features else "register\nneurons"
    for ax, metric in zip(axes, metrics):
        if metric == "pooled_cosine":
            _cosine_panel(ax, r, n_controls, target_label)
            continue
        s = r.summary[metric]
        heights = [s["baseline"], s["target"], s["control_mean"] if s["control_mean"] is not None else np.nan]
        ax.bar(range(3), heights, color=["0.6", "tab:red", "tab:blue"], alpha=0.85)
        if s["control_std"] is not None:
            ax.errorbar(2, heights[2], yerr=s["control_std"], capsize=6, color="black", lw=1.2)
        points = [r.conditions[f"control_{i}"][metric] for i in range(n_controls)
                  if r.conditions.get(f"control_{i}", {}).get(metric) is not None]
        if points:
            jitter = np.linspace(-0.2, 0.2, len(points)) if len(points) > 1 else [0.0]
            ax.plot(2 + np.asarray(jitter), points, "o", color="black", ms=3.5)
        for x, v in enumerate(heights):
            if v is not None and np.isfinite(v):
                _bar_label(ax, x, v, max([v] + points) if x == 2 else v)  # above the control dots
        ax.set_xticks(range(3), ["baseline", target_label, "controls\n(mean\u00b1std)"], fontsize=8)
        ax.set_ylabel(ABLATION_METRICS[metric], fontsize=9)
        top = max([v for v in heights + points if v is not None and np.isfinite(v)] + [1e-9])
        ax.set_ylim(0, top * 1.18)
        ax.set_title(metric.replace("_", " "), fontsize=10)
    if any(r.conditions.get(f"control_{i}") for i in range(n_controls)):  # one legend for every panel
        fig.legend(handles=[Line2D([], [], marker="o", color="black", ms=3.5, ls="none", label="one control"),
                            Line2D([], [], color="black", lw=1.2, label="\u00b1 std of the controls")],
                   loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def _cosine_panel(ax, r, n_controls: int, target_label: str) -> None:
    """The pooled vector's cosine to the unablated one as its distance from 1, ``1 - cos``, on a log axis: the
    cosines are all near 1, so bars of the cosine itself on a 0-1 axis look equal. The baseline (1 by
    definition) has no bar; each bar is labelled with the cosine's own digits."""
    s = r.summary["pooled_cosine"]
    cosines = [s["baseline"], s["target"], s["control_mean"]]
    gaps = [np.nan if c is None else max(1.0 - float(c), 0.0) for c in cosines]
    points = [1.0 - r.conditions[f"control_{i}"]["pooled_cosine"] for i in range(n_controls)
              if r.conditions.get(f"control_{i}", {}).get("pooled_cosine") is not None]
    shown = [g for g in gaps[1:] + points if np.isfinite(g) and g > 0]
    floor = min(shown) / 10 if shown else 1e-9
    ax.bar(range(3), [g if np.isfinite(g) and g > 0 else 0 for g in gaps], bottom=0,
           color=["0.6", "tab:red", "tab:blue"], alpha=0.85)
    if points:
        jitter = np.linspace(-0.2, 0.2, len(points)) if len(points) > 1 else [0.0]
        ax.plot(2 + np.asarray(jitter), [max(p, floor) for p in points], "o", color="black", ms=3.5)
    ax.set_yscale("log")
    top = max(shown + [floor * 10])
    ax.set_ylim(floor, top * 6)
    for x, (c, g) in enumerate(zip(cosines, gaps)):
        if c is not None:
            above = max([g] + points) if x == 2 else g
            ax.annotate("cos = " + near_one(c, gap=False), (x, max(above, floor)), xytext=(0, 5),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(3), ["baseline\n(cos = 1)", target_label, "controls\n(mean)"], fontsize=8)
    ax.set_ylabel("1 - cos(pooled vector, unablated one)", fontsize=9)
    ax.set_title("pooled cosine (distance from 1)", fontsize=10)


# ----------------------------------------------------------------------------------------- relocation
@figure(RelocateResult, "relocation_maps", images=True)
def relocation_maps(relocation_result, images=None) -> Figure:
    """Outlier maps before (top row) and after (bottom row) relocation, the target mask outlined.

    Args:
        images: optional Tensor[N, 3, H, W] in 0..1 or PIL images, as in :func:`outlier_maps`.
    """
    r = relocation_result
    title = f"{r.model}: relocation of the register neurons onto a target (dashed cyan), block {r.detect_layer}"
    if not r.ids:
        return message_figure(title, "no images in this result")
    n = min(len(r.ids), MAX_PANELS)
    pictures = display_arrays(images, n)
    target = np.asarray(r.target, dtype=bool)
    before = np.asarray(r.outlier_maps_before, dtype=np.int64)
    after = np.asarray(r.outlier_maps_after, dtype=np.int64)
    cols = min(n, 4)  # 8 images side by side made a 2300 px figure shown at half size: titles unreadable
    blocks = -(-n // cols)
    fig = Figure(figsize=(2.6 * cols + 0.8, 5.6 * blocks + 0.4), layout="constrained")
    grid = fig.subplots(2 * blocks, cols, squeeze=False)
    colors = []
    for i in range(n):
        picture = None if pictures is None else pictures[i]
        top, col = 2 * (i // cols), i % cols
        for row, maps in ((top, before), (top + 1, after)):
            ax = grid[row, col]
            width, height, color = _map_panel(ax, maps[i], picture)
            colors.append(color)
            _outline(ax, target, width, height, halo=True, linestyle=(0, (2.5, 1.5)))
        grid[top, col].set_title(f"{short_name(r.ids[i])}\n{plural(int(before[i].sum()), 'outlier')} before", fontsize=9)
        grid[top + 1, col].set_title(f"after: {plural(int(after[i].sum()), 'outlier')}, IoU {r.iou[i]:.2f}",
                                     fontsize=9)
    for i in range(n, blocks * cols):  # empty places of the last row of images
        grid[2 * (i // cols), i % cols].set_axis_off()
        grid[2 * (i // cols) + 1, i % cols].set_axis_off()
    for b in range(blocks):
        grid[2 * b, 0].set_ylabel("before", fontsize=10)
        grid[2 * b + 1, 0].set_ylabel("after relocation", fontsize=10)
    active = "" if r.mean_iou_active is None else f", {r.mean_iou_active:.2f} on images with outliers before"
    shown = "" if n == len(r.ids) else f"; first {n} of {len(r.ids)} images"
    thr = "" if r.counting_threshold is None else f", outlined and tinted = norm > {r.counting_threshold:.3g}"
    target_handle = Line2D([], [], color=TARGET_COLOR, ls=(0, (2.5, 1.5)), lw=1.6, label="target (the smiley)")
    cut = r.counting_threshold
    outline_legend(fig, colors, "outlier patch" + ("" if cut is None else f": norm > {cut:.3g}"),
                   extra=[target_handle])
    fig.suptitle(f"{title}\nmean IoU with target {r.mean_iou:.2f}{active}{thr}{shown}", fontsize=10)
    return fig


# ----------------------------------------------------------------------------------------- registers
@figure(RegistersResult, "register_summary")
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
    if r.counting_threshold is not None:
        cut = r.counting_threshold
        ax.axhline(cut, color=THRESHOLD_COLOR, ls=":", label=f"threshold {cut:.3g}")
    ax.legend(fontsize=7, loc="best", framealpha=0.85)
    for x, v in enumerate(heights):
        if np.isfinite(v):
            _bar_label(ax, x, v, max([v] + reg) if x == 2 else v)  # above the per-image dots
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
    agree, cosine = r.with_register.get("top1_agreement"), r.with_register.get("pooled_cosine")
    behaviour = ("" if agree is None else f"\ntop-1 unchanged on {100 * agree:.0f} % of images") or \
        ("" if cosine is None else
         f"\npooled vector's cosine to the unedited one: {near_one(cosine)} (mean over images)")
    fig.suptitle(title + behaviour, fontsize=10)
    return fig
