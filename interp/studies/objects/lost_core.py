"""LOST's arithmetic on one image (Simeoni et al. 2021; the steps are in :mod:`interp.studies.objects.lost`'s
docstring): degrees, their order, seed, seed expansion, the seed's 4-connected component and its box, and
CorLoc's per-image hit; the study around it is :func:`interp.studies.objects.lost.lost_study`.

>>> out = lost_one(torch.randn(14 * 14, 64), (14, 14), k=100)
>>> len(out.box_cells), out.mask.shape
(4, torch.Size([14, 14]))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from ...errors import InterpError
from ...runtime.source import split_tokens
from ..core.stats import box_iou
from ...models.inputs.geometry import InputGeometry
from .configs import TIES


@dataclass
class LostOutput:
    """LOST on one image: seed (flat row-major patch index), degrees [P], mask [h, w] bool (M > 0),
    component [h, w] bool (the seed's 4-connected part), box_cells [x0, y0, x1, y1] (end exclusive)."""

    seed: int
    degrees: torch.Tensor
    mask: torch.Tensor
    component: torch.Tensor
    box_cells: List[int]
    degenerate: bool


def key_features(keys: torch.Tensor, layout) -> torch.Tensor:
    """Patch rows of ``hook_k`` [b, t, h, dh] (or [b, t, h*dh]), heads concatenated -> [b, P, h*dh]."""
    flat = keys.reshape(keys.shape[0], keys.shape[1], -1)
    _, patches = split_tokens(flat, layout)
    return patches


def degrees_of(affinity: torch.Tensor) -> torch.Tensor:
    """Number of positive off-diagonal entries per row of a [P, P] affinity -> [P] long."""
    off_diagonal = ~torch.eye(affinity.shape[0], dtype=torch.bool, device=affinity.device)
    return ((affinity > 0) & off_diagonal).sum(1)


def seed_component(mask: torch.Tensor, seed_rc: Tuple[int, int]) -> torch.Tensor:
    """The 4-connected component of ``mask`` [h, w] bool that holds ``seed_rc`` (empty if it is off the mask).

    Grown by repeated 4-neighbour dilation restricted to the mask, until it stops changing."""
    comp = torch.zeros_like(mask)
    if not mask[seed_rc]:
        return comp
    comp[seed_rc] = True
    while True:
        grown = comp.clone()
        grown[1:] |= comp[:-1]
        grown[:-1] |= comp[1:]
        grown[:, 1:] |= comp[:, :-1]
        grown[:, :-1] |= comp[:, 1:]
        grown &= mask
        if torch.equal(grown, comp):
            return comp
        comp = grown


def degree_order(degrees: torch.Tensor, ties: str = "index") -> torch.Tensor:
    """Patch indices by ascending degree [P]: ties by patch index (``"index"``), or the reference's own
    ``torch.argsort(-degree, descending=True)`` (``"torch"``: not stable; its tie order is the device's)."""
    if ties == "index":
        return torch.sort(degrees, stable=True).indices
    if ties == "torch":
        return torch.argsort(-degrees.float(), descending=True)
    raise InterpError(f"ties={ties!r}: use one of {list(TIES)}")


def lost_one(features: torch.Tensor, grid: Tuple[int, int], k: int = 100, ties: str = "index") -> LostOutput:
    """LOST on one image's patch features [P, D] on a grid (h, w) with P = h * w (module docstring, steps 1-5;
    ``ties``: :func:`degree_order`)."""
    h, w = grid
    if features.shape[0] != h * w:
        raise InterpError(f"{features.shape[0]} patch features do not fill the {h}x{w} grid")
    feats = features.double()
    affinity = feats @ feats.T
    degrees = degrees_of(affinity)
    order = degree_order(degrees, ties)
    seed = int(order[0])
    candidates = order[:k]
    similar = candidates[affinity[seed, candidates] > 0]
    mask = (affinity[similar].sum(0) > 0).reshape(h, w)
    component = seed_component(mask, divmod(seed, w))
    if not component.any():  # the seed row has A[seed, seed] = |f|^2 > 0, so only a zero feature gets here
        raise InterpError(f"LOST: the seed patch {seed} is not in the mask (an all-zero key vector?)")
    rows, cols = component.nonzero(as_tuple=True)
    box = [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]
    return LostOutput(seed, degrees, mask, component, box, bool(degrees.min() == degrees.max()))


def cells_to_input(box_cells: Sequence[int], patch_size: Tuple[int, int]) -> List[float]:
    """A cell box [x0, y0, x1, y1] (end exclusive) -> input pixels, pixel-edge coordinates."""
    ph, pw = patch_size
    x0, y0, x1, y1 = box_cells
    return [float(x0 * pw), float(y0 * ph), float(x1 * pw), float(y1 * ph)]


def input_to_original(box: Sequence[float], geometry: InputGeometry) -> List[float]:
    """Inverse of :meth:`InputGeometry.to_input`: an input-pixel box -> original pixels, clipped to the image."""
    width, height = geometry.image_size
    x0, y0, x1, y1 = box
    fx = [min(max((u - geometry.offset_x) / geometry.scale_x, 0.0), float(width)) for u in (x0, x1)]
    fy = [min(max((v - geometry.offset_y) / geometry.scale_y, 0.0), float(height)) for v in (y0, y1)]
    return [fx[0], fy[0], fx[1], fy[1]]


def corloc_hits(pred: Sequence[Optional[Sequence[float]]], gt: Sequence[Sequence[Sequence[float]]],
                iou: float = 0.5) -> List[Optional[bool]]:
    """Per image: does the predicted box reach IoU >= ``iou`` with any ground-truth box? None when the image
    has no ground-truth box or no predicted box (it is left out of CorLoc)."""
    def hit(p, g) -> bool:
        v = box_iou(p, g)  # None (two zero-area boxes) is no hit
        return v is not None and v >= iou

    return [None if p is None or not boxes else any(hit(p, g) for g in boxes) for p, boxes in zip(pred, gt)]
