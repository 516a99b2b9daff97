"""The figure of the massive-activation study (docs/methods.md section 2): Sun et al.'s per-block profile of the
largest |activation| against the median, with the ratio and the massive blocks marked.

>>> from interp.studies.artifacts.massive import massive_study
>>> fig = massive_profile(massive_study(source, progress=False)); fig.savefig("massive.png", dpi=110)
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..studies.artifacts.massive import MassiveResult
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
