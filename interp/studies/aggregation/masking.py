"""Masking probe (docs/methods.md section 3): mask the top-k or bottom-k patches by Patch Score on the input
image, re-run the model, and measure what is lost.

Two passes over the images:

1. Unmasked forward: Patch Score maps (:mod:`interp.studies.aggregation.patch_score`), top-1 predictions, last-block
   patch-token norms (for a percentile outlier threshold) and, for ``fill="mean"``, the dataset mean.
2. For each batch, one forward per (fraction, order): the ``round(fraction * n_patches)`` patches of highest
   (``top``) or lowest (``bottom``) score are replaced, on the input grid of the model's patch size
   (cell (r, c) = input pixels ``[r*ph, (r+1)*ph) x [c*pw, (c+1)*pw)``), by the fill:

   * ``zero``: 0 in normalised input space (the normalisation mean colour);
   * ``mean``: the per-channel mean of all images of the source, in normalised space;
   * ``blur``: the same pixels of a Gaussian-blurred copy of the image (``blur_sigma`` pixels,
     default half the patch size; replicate padding).

Reported per (order, fraction): accuracy (when the image folder gives labels), top-1 agreement with the
unmasked model, and the mean number of outlier patch tokens per image: patch tokens whose norm at the
last block's ``hook_resid_post`` exceeds ``outlier_threshold`` (a number, ``"pNN"`` = the NN-th percentile of
the unmasked run's patch-token norms there, or ``"auto"``; see :mod:`interp.studies.core.outliers`).

Labels: image-folder class names that are integers are taken as the model's class indices; otherwise the
sorted folder index is used (right when the folders are the model's full class list, e.g. ImageNet synsets).

>>> result = masking_study(source, fractions=[0, 0.3, 0.6], fill="blur", progress=False)
>>> result.curves["bottom"]["agreement"][0]        # nothing masked: top-1 agrees with the unmasked model
1.0
>>> result.curves["bottom"]["accuracy"] is None    # the sample photos carry no labels
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from ..._progress import tqdm

from ...errors import InterpError
from ...interventions.selective_cls import SelectiveCLS
from ...hooks.names import resid_post
from ..core.forward import run_hooks
from ..core.outliers import ThresholdSpec, resolve_threshold
from .patch_score import FINAL, needed_hooks, score_maps_from_acts
from ..core.source import live_model, n_batches
from ..core.result import StudyResult

FILLS = ("zero", "mean", "blur")
ORDERS = ("top", "bottom")
DEFAULT_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(10))


# ---------------------------------------------------------------------------------------------- masking
def n_masked(fraction: float, n_patches: int) -> int:
    """Patches masked for a fraction: ``round(fraction * n_patches)``."""
    if not 0.0 <= fraction <= 1.0:
        raise InterpError(f"masking fraction {fraction} must be in [0, 1]")
    return int(round(fraction * n_patches))


def cells_to_mask(scores: torch.Tensor, k: int, order: str) -> torch.Tensor:
    """The k highest (``top``) or lowest (``bottom``) score cells of each image. scores [b, h, w] -> bool [b, h, w].

    Ties keep row-major order (stable sort)."""
    if order not in ORDERS:
        raise InterpError(f"order={order!r} is not one of {list(ORDERS)}")
    flat = scores.flatten(1)
    ranked = torch.sort(flat, dim=1, descending=(order == "top"), stable=True).indices[:, :k]
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask.scatter_(1, ranked, True)
    return mask.view_as(scores)


def pixel_mask(cells: torch.Tensor, patch_size: Tuple[int, int]) -> torch.Tensor:
    """Cells [b, h, w] -> input pixels [b, h*ph, w*pw] (each cell covers its patch of the input grid)."""
    ph, pw = patch_size
    return cells.repeat_interleave(ph, dim=1).repeat_interleave(pw, dim=2)


def mask_images(x: torch.Tensor, cells: torch.Tensor, fill: torch.Tensor, patch_size: Tuple[int, int]) -> torch.Tensor:
    """Images [b, C, H, W] with the pixels of the chosen cells replaced by ``fill`` (broadcast to x:
    [C] per channel, or [b, C, H, W] images); other pixels are left exactly as they are."""
    pixels = pixel_mask(cells, patch_size)
    if pixels.shape[-2:] != x.shape[-2:]:
        raise InterpError(f"images are {tuple(x.shape[-2:])} but the patch grid covers {tuple(pixels.shape[-2:])}")
    if fill.dim() == 1:
        fill = fill.view(1, -1, 1, 1)
    return torch.where(pixels[:, None].to(x.device), fill.to(x.dtype), x)


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of images [b, C, H, W] (radius ceil(3 sigma), replicate padding)."""
    radius = max(1, int(math.ceil(3 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=torch.float32, device=x.device)
    kernel = torch.exp(-t ** 2 / (2 * sigma ** 2))
    kernel = (kernel / kernel.sum()).to(x.dtype)
    c = x.shape[1]
    out = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="replicate"), kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1),
                   groups=c)
    return F.conv2d(F.pad(out, (0, 0, radius, radius), mode="replicate"), kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1),
                    groups=c)


def target_classes(source) -> Optional[torch.Tensor]:
    """Model class index of each image from the image-folder layout, or None without labels (module doc)."""
    labels = source.labels
    if labels is None:
        return None
    names = list(source.class_names)
    if names and all(n.isdigit() for n in names):
        return torch.tensor([int(names[label]) for label in labels])
    return torch.tensor(labels)


# ---------------------------------------------------------------------------------------------- result
@dataclass
class MaskingResult(StudyResult):
    """Result of :func:`masking_study`.

    Attributes:
        fractions: masked share of patches; n_masked: patches masked per fraction.
        curves: order ("top"/"bottom") -> {"accuracy": [...] or None, "agreement": [...],
            "outliers_per_image": [...]}, one value per fraction.
        unmasked: {"accuracy": ... or None, "outliers_per_image": ...} of the unmasked run.
        metric: "accuracy" when labels exist, else "agreement" (the curve plots show this one).
        fill_value: the per-channel fill in normalised space (``zero``/``mean``; None for ``blur``).
        outlier_threshold: the resolved norm threshold; outlier_rule: how it was set ("p98", "150", "auto").
    """

    study = "masking"
    fractions: List[float] = field(default_factory=list)
    n_masked: List[int] = field(default_factory=list)
    n_images: int = 0
    n_patches: int = 0
    grid: List[int] = field(default_factory=list)
    patch_size: List[int] = field(default_factory=list)
    fill: str = "zero"
    fill_value: Optional[List[float]] = None
    blur_sigma: Optional[float] = None
    reference: str = "cls"
    hook: str = FINAL
    metric: str = "agreement"
    curves: Dict[str, Dict[str, Optional[List[float]]]] = field(default_factory=dict)
    unmasked: Dict[str, Optional[float]] = field(default_factory=dict)
    outlier_threshold: Optional[float] = None
    outlier_rule: str = "p98"


# ---------------------------------------------------------------------------------------------- study
@dataclass
class _Unmasked:
    scores: torch.Tensor       # [N, h, w]
    preds: torch.Tensor        # [N]
    norms: torch.Tensor        # [N, n_patches] last-block patch-token norms
    channel_mean: torch.Tensor  # [C] mean of the images in normalised space


@torch.no_grad()
def _unmasked_pass(source, hook: str, reference: str, selective: Optional[SelectiveCLS], batch_size: int,
                   progress: bool) -> _Unmasked:
    model = source.model
    score_hooks = needed_hooks(hook, reference)
    last = resid_post(model.n_layers - 1)
    scores, preds, norms = [], [], []
    channel_sum, n_pixels = None, 0
    for _, x in tqdm(source.image_batches(batch_size), total=n_batches(source, batch_size), disable=not progress,
                     desc="masking: unmasked pass", unit="batch", leave=False):
        run = run_hooks(model, x, score_hooks + [last], logits=True)
        scores.append(score_maps_from_acts(run.acts, run.layout, hook, reference, selective))
        preds.append(run.logits.argmax(-1))
        norms.append(run.acts[last][:, run.layout.patch_slice].norm(dim=-1))
        s = x.double().sum(dim=(0, 2, 3)).cpu()
        channel_sum = s if channel_sum is None else channel_sum + s
        n_pixels += x.shape[0] * x.shape[2] * x.shape[3]
    return _Unmasked(torch.cat(scores), torch.cat(preds), torch.cat(norms), (channel_sum / n_pixels).float())


@torch.no_grad()
def _forward_counting_outliers(model, x: torch.Tensor, hook: str, threshold: float) -> Tuple[torch.Tensor,
                                                                                           torch.Tensor]:
    """One forward: (top-1 class [b], number of patch tokens whose norm at ``hook`` exceeds threshold [b])."""
    def count(layout):
        return {hook: lambda t: (t[:, layout.patch_slice].float().norm(dim=-1) > threshold).sum(1)}

    run = run_hooks(model, x, [hook], count, logits=True)
    return run.logits.argmax(-1), run.acts[hook].long()


def masking_study(source, *, fractions: Sequence[float] = DEFAULT_FRACTIONS, fill: str = "zero",
                  blur_sigma: Optional[float] = None, reference: str = "cls", hook: str = FINAL,
                  selective: Optional[SelectiveCLS] = None, outlier_threshold: ThresholdSpec = "p98",
                  batch_size: Optional[int] = None, progress: bool = True) -> MaskingResult:
    """Masking probe on a live source (module docstring).

    Args:
        source: a live source (``open_source(model=..., images=...)``); labels from an image-folder layout.
        fractions: shares of the patches to mask, each in [0, 1] (default 0, 0.1, ..., 0.9).
        fill: ``zero``, ``mean`` or ``blur``.
        blur_sigma: Gaussian sigma in input pixels for ``blur`` (default: half the patch size).
        reference, hook, selective: the Patch Score that orders the patches.
        outlier_threshold: a norm, ``"pNN"`` or ``"auto"`` at the last block's ``hook_resid_post``.
        batch_size: images per forward (default: the source's).
    """
    model = live_model(source, "masking probe")
    if fill not in FILLS:
        raise InterpError(f"fill={fill!r} is not one of {list(FILLS)}")
    fractions = [float(f) for f in fractions]
    bs = batch_size or source.batch_size
    grid = tuple(source.layout.grid)
    patch = source.patch_size
    n_patches = grid[0] * grid[1]
    ks = [n_masked(f, n_patches) for f in fractions]
    sigma = float(blur_sigma) if blur_sigma is not None else patch[0] / 2.0

    base = _unmasked_pass(source, hook, reference, selective, bs, progress)
    threshold = resolve_threshold(base.norms.reshape(-1).numpy(), outlier_threshold)
    thr = threshold.value
    fill_value = torch.zeros_like(base.channel_mean) if fill == "zero" else base.channel_mean

    last = resid_post(model.n_layers - 1)
    preds = {(o, i): [] for o in ORDERS for i in range(len(ks))}
    outliers = {(o, i): [] for o in ORDERS for i in range(len(ks))}
    with torch.no_grad():
        for start, x in tqdm(source.image_batches(bs), total=n_batches(source, bs), disable=not progress,
                             desc="masking: masked runs", unit="batch", leave=False):
            scores = base.scores[start:start + len(x)]
            fill_images = gaussian_blur(x, sigma) if fill == "blur" else fill_value.to(x.device)
            for i, k in enumerate(ks):
                for order in ORDERS:
                    masked = mask_images(x, cells_to_mask(scores, k, order), fill_images, patch)
                    top1, n_outliers = _forward_counting_outliers(model, masked, last, thr)
                    preds[(order, i)].append(top1)
                    outliers[(order, i)].append(n_outliers)

    labels = target_classes(source)

    def rate(p: torch.Tensor, ref: torch.Tensor) -> float:
        return float((p == ref).float().mean())

    curves: Dict[str, Dict[str, Optional[List[float]]]] = {}
    for order in ORDERS:
        p = [torch.cat(preds[(order, i)]) for i in range(len(ks))]
        o = [torch.cat(outliers[(order, i)]) for i in range(len(ks))]
        curves[order] = {
            "accuracy": None if labels is None else [rate(pi, labels) for pi in p],
            "agreement": [rate(pi, base.preds) for pi in p],
            "outliers_per_image": [float(oi.float().mean()) for oi in o],
        }
    unmasked = {"accuracy": None if labels is None else rate(base.preds, labels),
                "outliers_per_image": float((base.norms > thr).sum(1).float().mean())}
    params = {"fractions": fractions, "fill": fill, "blur_sigma": sigma if fill == "blur" else None,
              "reference": reference, "hook": hook, "outlier_threshold": str(outlier_threshold),
              "selective": (selective or SelectiveCLS()).params() if reference == "selective" else None}
    return MaskingResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None,
        fractions=fractions, n_masked=ks, n_images=len(source), n_patches=n_patches, grid=list(grid),
        patch_size=list(patch), fill=fill, fill_value=None if fill == "blur" else fill_value.tolist(),
        blur_sigma=sigma if fill == "blur" else None, reference=reference, hook=hook,
        metric="accuracy" if labels is not None else "agreement", curves=curves, unmasked=unmasked,
        outlier_threshold=thr if math.isfinite(thr) else None, outlier_rule=str(outlier_threshold),
    )
