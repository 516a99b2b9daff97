"""The figures of the per-token studies (docs/methods.md section 2): Sun et al.'s per-block profile of the largest
|activation| against the median (massive activations), and the effects of replacing a token set (token replacement).

>>> from interp.studies.artifacts.massive import massive_study
>>> fig = massive_profile(massive_study(source, progress=False)); fig.savefig("massive.png", dpi=110)
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..studies.artifacts.massive import MassiveResult
from ..studies.artifacts.replace import ReplaceResult
from .common import THRESHOLD_COLOR, short_name
from .registry import figure

TOP_STYLE = (("top 1", "#c0392b"), ("top 2", "#e67e22"), ("top 3", "#f1c40f"))


@figure(MassiveResult, "massive_profile")
def massive_profile(result: MassiveResult) -> Figure:
    """Left: per block, the mean over images of the top-1/2/3 |activation| and of the median (the reference's
    layer-wise plot). Right: top-1 / median on a log axis, the massive ratio as a line, massive blocks filled."""
    blocks = np.arange(len(result.blocks))
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    for (label, color), values in zip(TOP_STYLE, result.top):
        left.plot(blocks, values, marker="o", color=color, label=label)
    left.plot(blocks, result.median, marker="o", color="#2c3e50", label="median")
    left.set_xlabel("block")
    left.set_ylabel("|activation| (residual stream, before the final norm)")
    left.legend(fontsize=8)
    ratio = np.asarray(result.ratio, dtype=np.float64)
    massive = np.isin(blocks, result.massive_blocks)
    right.semilogy(blocks, ratio, color="#7f8c8d", zorder=1)
    right.scatter(blocks[~massive], ratio[~massive], facecolors="white", edgecolors="#7f8c8d", zorder=2,
                  label="not massive")
    if massive.any():
        right.scatter(blocks[massive], ratio[massive], color="#c0392b", zorder=2, label="massive")
    right.axhline(result.params.get("min_ratio", 1000.0), color=THRESHOLD_COLOR, linestyle="--", linewidth=1,
                  label=f"{result.params.get('min_ratio', 1000.0):g}x (with |a| > {result.params.get('min_value', 100.0):g})")
    if result.final_norm:
        right.axhline(result.final_norm["ratio"], color="#2980b9", linestyle=":", linewidth=1,
                      label=f"after the final norm: {result.final_norm['ratio']:.0f}x")
    right.set_xlabel("block")
    right.set_ylabel("top-1 / median")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xticks(blocks if len(blocks) <= 16 else blocks[::max(1, len(blocks) // 12)])
    fig.suptitle(f"{short_name(result.model, 40)}: massive activations per block ({len(result.ids)} images)",
                 fontsize=10)
    return fig


MODE_COLORS = {"zero": "#c0392b", "mean": "#2980b9", "noise": "#8e44ad", "shuffle": "#27ae60", "control": "#7f8c8d"}


@figure(ReplaceResult, "replacement_effects")
def replacement_effects(result: ReplaceResult) -> Figure:
    """Left: each replacement's loss on the behaviour metric, the random-patch control beside it. Right: the
    CLS->patch attention's Jensen-Shannon divergence to the intact model per block (when the model has CLS)."""
    names = [n for n in ("zero", "mean", "noise", "shuffle", "control") if n in result.conditions]
    effects = [result.conditions[n]["effect"] for n in names]
    has_js = any(result.conditions[n].get("attention_js") for n in names)
    fig = Figure(figsize=(10 if has_js else 5.5, 3.6), layout="constrained")
    axes = fig.subplots(1, 2) if has_js else [fig.subplots()]
    labels = [f"{len(result.control_rows)} random\npatches zeroed" if n == "control" else n for n in names]
    axes[0].bar(range(len(names)), effects, color=[MODE_COLORS[n] for n in names])
    axes[0].set_xticks(range(len(names)), labels, fontsize=8)
    axes[0].set_ylabel({"accuracy": "accuracy lost", "top1_agreement": "1 - top-1 agreement",
                        "pooled_cosine": "1 - cosine of the pooled vector"}[result.metric])
    axes[0].set_title(f"{result.target} replaced: {result.verdict}", fontsize=9)
    if has_js:
        for n in names:
            js = result.conditions[n].get("attention_js")
            if js:
                axes[1].plot(range(len(js)), js, marker="o", color=MODE_COLORS[n], label=n)
        axes[1].set_xlabel("block")
        axes[1].set_ylabel("JS divergence of CLS->patch attention (bits)")
        axes[1].legend(fontsize=8)
    fig.suptitle(f"{short_name(result.model, 40)}: token replacement ({len(result.ids)} images)", fontsize=10)
    return fig
