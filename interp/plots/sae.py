"""Figures of the sae-features study (docs/sae.md): the strongest patch tokens of each artifact feature (image
crops when the study ran live) and each artifact feature's map on the first images.

>>> from interp.studies.sae.sae_features import sae_features_study
>>> figs = study_figures(sae_features_study(source, sae="out/sae", progress=False), images)  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..studies.sae.sae_features import SaeFeaturesResult
from .common import MAX_PANELS, TARGET_COLOR, display_arrays, message_figure, short_name
from .registry import figure

MAX_FEATURES = 6  # artifact features drawn (the most concentrated on the high-norm tokens first)


def _no_features(result, what: str) -> Optional[Figure]:
    """The message figure of a result without artifact features (None when it has some)."""
    if result.artifact_features:
        return None
    detail = result.message + (f" ({result.reason})" if result.artifacts_found and result.reason else "")
    return message_figure(f"{short_name(result.model, 40)}: SAE features at {result.hook} ({what})",
                          "no artifact features", detail)


def _crop(ax, image: np.ndarray, grid, patch: int, margin: int = 1) -> None:
    """Draw the patch ``patch`` (flat, row-major on ``grid``) of ``image`` [H, W, 3] with ``margin`` patches
    around it, the patch itself outlined."""
    gh, gw = grid
    ph, pw = image.shape[0] // gh, image.shape[1] // gw
    r, c = divmod(int(patch), gw)
    top, left = max(0, (r - margin) * ph), max(0, (c - margin) * pw)
    ax.imshow(image[top:(r + 1 + margin) * ph, left:(c + 1 + margin) * pw])
    ax.add_patch(Rectangle((c * pw - left - 0.5, r * ph - top - 0.5), pw, ph, fill=False, edgecolor=TARGET_COLOR,
                           linewidth=1.5))


@figure(SaeFeaturesResult, "sae_top_patches", images=True)
def top_patches(result: SaeFeaturesResult, images=None) -> Figure:
    """One row per artifact feature: its strongest patch tokens, each as an image crop (the patch and one patch
    around it) when the images are given, else as the image id, cell and code."""
    empty = _no_features(result, "top patches")
    if empty is not None:
        return empty
    features = result.artifact_features[:MAX_FEATURES]
    arrays = None if images is None else display_arrays(images, len(images))
    cols = max(1, max(len(f.get("top_patches", [])) for f in features))
    fig = Figure(figsize=(1.5 * cols + 0.6, 1.7 * len(features) + 0.4), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(features), cols, squeeze=False))
    for row, f in zip(axes, features):
        row[0].set_ylabel(f"feature {f['feature']}", fontsize=9)
        for ax, p in zip(row, f.get("top_patches", []) + [None] * cols):
            ax.set_xticks([])
            ax.set_yticks([])
            if p is None:
                ax.axis("off")
                continue
            r, c = divmod(int(p["patch"]), result.grid[1]) if result.grid and result.grid[1] else (0, int(p["patch"]))
            image_id = result.ids[p["image"]] if p["image"] < len(result.ids) else str(p["image"])
            if arrays is not None and p["image"] < len(arrays):
                _crop(ax, arrays[p["image"]], result.grid, p["patch"])
            else:
                ax.text(0.5, 0.5, f"{short_name(image_id, 14)}\ncell ({r}, {c})", ha="center", va="center",
                        fontsize=7, transform=ax.transAxes)
            ax.set_title(f"code {p['code']:.3g}", fontsize=7)
    fig.suptitle(f"{short_name(result.model, 40)}: strongest patches of the artifact features ({result.hook})",
                 fontsize=10)
    return fig


@figure(SaeFeaturesResult, "sae_feature_maps", images=True, options=("n_maps",))
def feature_maps(result: SaeFeaturesResult, images=None, n_maps: int = 4) -> Figure:
    """One row per artifact feature, one column per image: the feature's code on each patch (over the image when
    given; one colour scale per feature)."""
    empty = _no_features(result, "feature maps")
    if empty is not None:
        return empty
    features = [f for f in result.artifact_features[:MAX_FEATURES] if f.get("maps")]
    if not features or not result.grid or not all(result.grid):
        return message_figure(f"{short_name(result.model, 40)}: SAE feature maps at {result.hook}",
                              "no maps", "the stored tokens have no patch grid (a cache of prefix tokens only)")
    n = min(n_maps, MAX_PANELS, min(len(f["maps"]) for f in features))
    arrays = None if images is None else display_arrays(images, len(images))
    gh, gw = result.grid
    fig = Figure(figsize=(2.0 * n + 0.8, 2.0 * len(features) + 0.4), layout="constrained")
    axes = fig.subplots(len(features), n, squeeze=False)
    for row, f in zip(axes, features):
        maps = np.asarray(f["maps"][:n], dtype=np.float64).reshape(-1, gh, gw)
        top = float(maps.max()) or 1.0
        for i, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            if arrays is not None and i < len(arrays):
                height, width = arrays[i].shape[:2]
                ax.imshow(arrays[i], extent=(0, width, height, 0))
                # patches where the feature is silent stay clear: the image shows through
                shown = ax.imshow(np.ma.masked_less_equal(maps[i], 0), extent=(0, width, height, 0), cmap="magma",
                                  vmin=0, vmax=top, alpha=0.75, interpolation="nearest")
            else:
                shown = ax.imshow(maps[i], cmap="magma", vmin=0, vmax=top, interpolation="nearest")
            if i == 0:
                ax.set_ylabel(f"feature {f['feature']}", fontsize=9)
            if f is features[0]:
                ax.set_title(short_name(result.ids[i] if i < len(result.ids) else str(i), 18), fontsize=8)
        fig.colorbar(shown, ax=list(row), shrink=0.8, label="code")
    fig.suptitle(f"{short_name(result.model, 40)}: artifact feature codes per patch ({result.hook})", fontsize=10)
    return fig
