"""Figures of the object studies: LOST (seed, mask and box on each image; the run under an intervention in a
second row) and coarse segmentation (the foreground cells over each image, one row per variant).

Images are the model-input frames the study saw (``source.display_images()``: Tensor[N, 3, H, W] in 0..1);
without them the cells are drawn on a grey grid.

>>> from interp.studies.objects.lost import lost_study
>>> from interp.studies.objects.segment import segment_study
>>> fig = lost_boxes(lost_study(source, progress=False), source.display_images())
>>> fig = segmentation_overlays(segment_study(source, masks="masks.json", progress=False), source.display_images())
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .common import MAX_PANELS, display_arrays, message_figure, short_name
from ..studies.objects.lost import LostResult
from ..studies.objects.segment import SegmentResult
from .registry import figure

BOX_COLOR = "#00e5ff"
SEED_COLOR = "yellow"


def _rows_figure(n_rows: int, n_cols: int, wrap: int = 4) -> Tuple[Figure, np.ndarray]:
    """A figure of ``n_rows`` variants x ``n_cols`` images -> axes [n_rows, n_cols]; the images wrap after
    ``wrap`` columns (each wrapped block repeats the variants' rows), so 8 images stay readable (1 row of 8 was
    2000 px wide, shown at half size)."""
    cols = max(1, min(n_cols, wrap))
    blocks = -(-n_cols // cols)
    fig = Figure(figsize=(2.3 * cols + 0.2, (2.5 * n_rows) * blocks + 0.4), layout="constrained")
    grid = fig.subplots(n_rows * blocks, cols, squeeze=False)
    axes = np.empty((n_rows, n_cols), dtype=object)
    for i in range(blocks * cols):
        for r in range(n_rows):
            ax = grid[(i // cols) * n_rows + r, i % cols]
            if i < n_cols:
                axes[r, i] = ax
            else:
                ax.set_axis_off()
    return fig, axes


def _cells_panel(ax, cells: np.ndarray, image: Optional[np.ndarray]) -> Tuple[float, float]:
    """``image`` (or a grey canvas) with the cells OFF a bool mask [h, w] dimmed, so the mask stays visible
    even when it covers the whole image. -> (width, height) in display pixels."""
    h, w = cells.shape
    base = image if image is not None else np.full((h, w, 3), 0.93)
    height, width = base.shape[:2]
    ax.imshow(base, extent=(0, width, height, 0), interpolation="bilinear")
    shade = np.zeros((h, w, 4), dtype=np.uint8)
    shade[~cells] = (0, 0, 0, 150)
    ax.imshow(shade, extent=(0, width, height, 0), interpolation="nearest")
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    return width, height


def _lost_panel(ax, run: Dict, i: int, grid: Sequence[int], image: Optional[np.ndarray]) -> None:
    """Image i of one LOST run: cells off the mask dimmed, the box in cyan, the seed as a yellow star."""
    mask = np.asarray(run["masks"][i], dtype=bool) if run.get("masks") else np.ones(tuple(grid), dtype=bool)
    h, w = mask.shape  # the image's own grid (LOST's protocol: one per image)
    width, height = _cells_panel(ax, mask, image)
    sx, sy = width / w, height / h
    x0, y0, x1, y1 = run["box_cells"][i]
    ax.add_patch(Rectangle((x0 * sx, y0 * sy), (x1 - x0) * sx, (y1 - y0) * sy, fill=False, edgecolor=BOX_COLOR,
                           linewidth=2))
    row, col = divmod(int(run["seeds"][i]), w)
    ax.plot([(col + 0.5) * sx], [(row + 0.5) * sy], marker="*", markersize=12, color=SEED_COLOR,
            markeredgecolor="black")


@figure(LostResult, "lost_boxes", images=True)
def lost_boxes(result, images=None, n: int = MAX_PANELS) -> Figure:
    """LOST per image (up to ``n``): seed (star), mask M > 0 (the cells off it dimmed) and the seed component's
    box (cyan); a second row for the run under the intervention when the result has one. Titles flag tied
    seeds and CorLoc hits. When every image is a tied seed (the boxes are the whole image, no discovery) the
    figure is the result's note instead."""
    count = min(n, len(result.ids))
    if count == 0:
        return message_figure(f"{result.model}: LOST", "no image")
    if result.edited is None and result.degenerate and all(result.degenerate):
        return message_figure(f"{result.model}: LOST ({result.hook})", "degenerate: every image is a tied seed",
                              result.note or "")
    arrays = display_arrays(images, count)
    runs: List[Tuple[str, Dict]] = [("", vars(result))]
    if result.edited is not None:
        runs.append(((result.intervention or {}).get("kind", "edited"), result.edited))
    fig, axes = _rows_figure(len(runs), count)
    for r, (label, run) in enumerate(runs):
        for i in range(count):
            ax = axes[r, i]
            _lost_panel(ax, run, i, result.grid, None if arrays is None else arrays[i])
            notes = ["tied seed"] if run["degenerate"][i] else []
            if run["hits"] and run["hits"][i] is not None:
                notes.append("hit" if run["hits"][i] else "miss")
            title = short_name(result.ids[i]) + (f" [{label}]" if label else "")
            ax.set_title(title + ("\n" + ", ".join(notes) if notes else ""), fontsize=8)
    shown = "" if count == len(result.ids) else f"; first {count} of {len(result.ids)} images"
    fig.suptitle(f"{result.model}: LOST ({result.hook}, k={result.k}{shown})", fontsize=10)
    return fig


@figure(SegmentResult, "segmentation_overlays", images=True)
def segmentation_overlays(result, images=None, n: int = MAX_PANELS) -> Figure:
    """Foreground cells (score > mean + k std; the others dimmed) over each image (up to ``n``), one row per
    variant (the result's own reference first), with each image's mIoU and Jaccard in the title."""
    count = min(n, len(result.ids))
    if count == 0 or not result.foreground:
        return message_figure(f"{result.model}: coarse segmentation", "no foreground maps in this result")
    arrays = display_arrays(images, count)
    rows = [(result.reference, {"foreground": result.foreground, "jaccard": result.jaccard,
                                "image_miou": result.image_miou})]
    rows += [(name, v) for name, v in result.variants.items() if v.get("foreground")]
    fig, axes = _rows_figure(len(rows), count)
    for r, (label, run) in enumerate(rows):
        for i in range(count):
            ax = axes[r, i]
            _cells_panel(ax, np.asarray(run["foreground"][i], dtype=bool), None if arrays is None else arrays[i])
            scores = (run.get("image_miou") or [None] * count)[i], run["jaccard"][i]
            miou, jaccard = ("n/a" if v is None else f"{v:.2f}" for v in scores)
            ax.set_title(f"{short_name(result.ids[i])} [{label}]\nmIoU {miou}, Jaccard {jaccard}", fontsize=8)
    shown = "" if count == len(result.ids) else f"; first {count} of {len(result.ids)} images"
    fig.suptitle(f"{result.model}: coarse segmentation (Patch Score > mean + {result.k_std:g} std{shown})",
                 fontsize=10)
    return fig
