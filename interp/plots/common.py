"""What the artifact figures share: colours, the empty-result figure, image panels with outlier overlays,
and axis helpers. Every figure is built without pyplot (no GUI backend; freed with its last reference)."""
from __future__ import annotations

import math
import textwrap
from pathlib import PurePath
from typing import List, Optional, Sequence, Tuple

import numpy as np
from matplotlib import patheffects
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

MAX_PANELS = 8  # images drawn by the map figures (the first ones of the result)
NO_ARTIFACTS = "no artifacts found"  # not "no high-norm tokens": a fixed threshold may still have many above it

ATTN_COLOR = "#1f77b4"
MLP_COLOR = "#d62728"
THRESHOLD_COLOR = "#2ca02c"
OUTLIER_RGBA = (1.0, 0.1, 0.1, 0.6)  # no longer drawn by the map figures (see OVERLAY_COLORS); kept for callers
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


def plural(n: int, word: str) -> str:
    """'1 outlier patch', '3 outlier patches' (``word`` is the singular; -es after s, x, ch, sh)."""
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith(("s", "x", "ch", "sh")) else "s")


def near_one(value: Optional[float], digits: int = 3, gap: bool = True) -> str:
    """A cosine (or any value near 1) with enough decimals to differ from 1 and, with ``gap``, how far from 1.

    Within 1e-9 of 1 (rounding noise of an unedited run) it prints "1"; more than 0.01 from 1 with ``digits``
    significant digits; in between with two decimals past the first one that differs from 1:
    ``near_one(0.9999690)`` is ``"0.999969 (1 - 3.1e-05)"``.
    """
    if value is None:
        return "n/a"
    off = 1.0 - float(value)
    if abs(off) < 1e-9:
        return "1"
    if abs(off) > 0.01:
        return f"{value:.{digits}g}"
    text = f"{value:.{int(math.floor(-math.log10(abs(off)))) + 2}f}"
    return f"{text} (1 {'-' if off > 0 else '+'} {abs(off):.2g})" if gap else text


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


# Outline colours for the outlier patches; each panel takes the one that stands out most against its image.
OVERLAY_COLORS = ("#ffeb3b", "#ff2bd6", "#39ff14", "#2962ff")  # yellow, magenta, lime, blue


def overlay_color(image: Optional[np.ndarray], mask: Optional[np.ndarray] = None, avoid: Sequence[str] = ()) -> str:
    """The colour of :data:`OVERLAY_COLORS` (less ``avoid``) most distant from the image where it is drawn.

    Args:
        image: [H, W, 3] floats in 0..1 (None: a light grey background).
        mask: optional [h, w] 0/1 patch mask; its patches (and their neighbours) are where the colour must show.
    Returns:
        A hex colour: the one whose 10th-percentile RGB distance to those pixels is largest.
    """
    if image is None:
        pixels = np.full((1, 3), 0.93)
    else:
        step = max(1, min(image.shape[:2]) // 64)  # a ~64 x 64 sample is enough to judge colours
        small = np.asarray(image, dtype=np.float64)[::step, ::step, :3]
        pixels = small.reshape(-1, 3)
        if mask is not None and np.asarray(mask).any():
            m = np.asarray(mask, dtype=bool)
            near = m | np.roll(m, 1, 0) | np.roll(m, -1, 0) | np.roll(m, 1, 1) | np.roll(m, -1, 1)
            rows = np.minimum(np.arange(small.shape[0]) * m.shape[0] // small.shape[0], m.shape[0] - 1)
            cols = np.minimum(np.arange(small.shape[1]) * m.shape[1] // small.shape[1], m.shape[1] - 1)
            pixels = small[near[np.ix_(rows, cols)]]
    candidates = [c for c in OVERLAY_COLORS if c not in avoid] or list(OVERLAY_COLORS)
    worst = [np.percentile(np.linalg.norm(pixels - np.asarray(to_rgb(c)), axis=1), 10) for c in candidates]
    return candidates[int(np.argmax(worst))]


def _map_panel(ax, grid_map: np.ndarray, image: Optional[np.ndarray],
               avoid: Sequence[str] = ()) -> Tuple[float, float, Optional[str]]:
    """Draw a 0/1 patch map [h, w] over ``image`` (or a grey background): each marked region outlined (a dark
    halo under a colour chosen against the image, see :func:`overlay_color`) and lightly tinted, so it shows
    on red, orange or dark images alike. ``avoid``: colours used for something else.
    -> (width, height, the outline colour or None when nothing is marked)."""
    h, w = grid_map.shape
    if image is not None:
        height, width = image.shape[:2]
        ax.imshow(image, extent=(0, width, height, 0), interpolation="bilinear")
    else:
        height, width = h, w
        ax.imshow(np.full((h, w, 3), 0.93), extent=(0, width, height, 0), interpolation="nearest")
    marked = np.asarray(grid_map).astype(bool)
    color = None
    if marked.any():
        color = overlay_color(image, marked, avoid)
        rgba = np.zeros((h, w, 4))
        rgba[marked] = (*to_rgb(color), 0.3)
        ax.imshow(rgba, extent=(0, width, height, 0), interpolation="nearest")
        _outline(ax, marked, width, height, color=color, halo=True)
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    return width, height, color


def outline_legend(fig: Figure, colors: Sequence[Optional[str]], label: str, extra: Sequence = ()) -> None:
    """One legend below the panels: the outline colours used (one entry; the colour changes per image only to
    stand out against it) and ``extra`` handles."""
    used = [c for c in dict.fromkeys(colors) if c]
    handles, labels = list(extra), [h.get_label() for h in extra]
    if used:
        swatches = tuple(Patch(facecolor=(*to_rgb(c), 0.3), edgecolor=c, linewidth=1.6) for c in used)
        handles.insert(0, swatches)
        labels.insert(0, label + (" (outline colour chosen per image for contrast)" if len(used) > 1 else ""))
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False,
                   handler_map={tuple: HandlerTuple(ndivide=None, pad=0.2)})


def _outline(ax, mask: np.ndarray, width: float, height: float, color: str = TARGET_COLOR, halo: bool = False,
             linestyle: str = "solid") -> LineCollection:
    """Draw the boundary of a 0/1 patch mask [h, w] stretched over ``width`` x ``height`` pixels (the contour
    along patch edges); ``halo``: a dark line under it, visible on light and dark images."""
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
    lines = LineCollection(segments, colors=color, linewidths=1.6, linestyles=linestyle, capstyle="round")
    if halo:
        lines.set_path_effects([patheffects.Stroke(linewidth=3.4, foreground="black", alpha=0.8), patheffects.Normal()])
    ax.add_collection(lines)
    return lines


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
