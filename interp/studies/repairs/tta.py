"""Test-time-augmentation denoising, the training-free teacher of PH-Reg (Yan et al., NeurIPS 2025; code
``0raiser0/PH-Reg``, ``DINOv2_full/utils/denoising.py``, ``DINOv2_full/datasets/flickr30k_dataset.py`` and
``DINOv2_full/models/teacherDINOv2.py``, commit 5910d50f): the features of shifted and flipped views of an image,
each put back where its patch came from and averaged.

The reference's arithmetic, kept here:

* offsets: ``views * 10`` candidate (row, column) shifts in whole patches, drawn uniformly from ``[-s, s]`` with
  ``s = round(shift_frac * grid)`` (numpy ``default_rng(seed)``), thinned to ``views`` by farthest-point sampling
  (torch, seeded, the first pick at random); the first view's shift is (0, 0);
* flips: a horizontal flip per view drawn 0/1 (``default_rng``), never on the first view (so view 0 is the image);
* a view: the image moved by ``-offset`` patches (``out[y] = in[y + offset]``), the uncovered pixels filled with
  a constant, then flipped; the patch-index grid goes through the same moves (-1 where uncovered), so each view
  patch knows which image patch it shows;
* recovery: per view, each covered patch's feature added at its image patch; the sum divided by how many views
  cover each patch (the first view covers all).

Where interp differs: the reference fills uncovered pixels with ImageNet-normalised white (``(1 - mean) / std``
for the ImageNet mean and std); interp uses the model's own mean and std, which is the same for ImageNet-normalised
models. The reference's three seeds are independent random draws; interp derives them from one ``seed``
(``seed``, ``seed + 1``, ``seed + 2`` for offsets, flips and the sampling). The reference's grid is square; on a
non-square grid ``s`` comes from the shorter side.

>>> views = tta_views((14, 14), views=10, shift_frac=0.15, seed=0)
>>> views.offsets.shape, views.sources.shape          # [V, 2] shifts, [V, P] the image patch each view patch shows
(torch.Size([10, 2]), torch.Size([10, 196]))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np
import torch


@dataclass(frozen=True)
class Views:
    """The views of one augmentation set.

    Attributes:
        grid: (rows, columns) of patches.
        offsets: [V, 2] long, (row, column) shift of each view in patches; flips: [V] bool.
        sources: [V, P] long: for each view and view patch (row-major), the image patch it shows, -1 if none.
    """

    grid: Tuple[int, int]
    offsets: torch.Tensor
    flips: torch.Tensor
    sources: torch.Tensor

    def __len__(self) -> int:
        return int(self.offsets.shape[0])


def candidate_offsets(grid: Tuple[int, int], views: int, shift_frac: float, seed: int) -> torch.Tensor:
    """[1, views * 10, 2] float candidate shifts (the reference's ``prepare_all_offsets``)."""
    shift = int(round(shift_frac * min(grid)))
    rng = np.random.default_rng(seed=seed)
    rows = rng.integers(-shift, shift, size=views * 10, endpoint=True)
    cols = rng.integers(-shift, shift, size=views * 10, endpoint=True)
    return torch.from_numpy(np.stack([rows, cols], axis=1)[None]).float()


def farthest_points(points: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """[n] indices of ``points`` [1, N, 2] by farthest-point sampling from a seeded random first pick."""
    generator = torch.Generator().manual_seed(int(seed))
    picked = torch.zeros(n, dtype=torch.long)
    distance = torch.full((points.shape[1],), float("inf"))
    farthest = torch.randint(0, points.shape[1], (1,), generator=generator)[0]
    for i in range(n):
        picked[i] = farthest
        d = ((points[0] - points[0, farthest]) ** 2).sum(-1)
        distance = torch.minimum(distance, d)
        farthest = int(distance.argmax())
    return picked


def tta_views(grid: Tuple[int, int], views: int = 10, shift_frac: float = 0.15, seed: int = 0) -> Views:
    """The shifts, flips and patch sources of ``views`` views of an image of ``grid`` patches (module doc)."""
    if views < 1:
        raise ValueError(f"views must be >= 1, got {views}")
    candidates = candidate_offsets(grid, views, shift_frac, seed)
    flips = np.random.default_rng(seed=seed + 1).integers(0, 2, views)
    flips[0] = 0
    offsets = candidates[0, farthest_points(candidates, views, seed + 2)].long()
    offsets[0] = 0
    index = torch.arange(grid[0] * grid[1]).view(1, *grid)
    sources = torch.stack([view_of(index, (int(o[0]), int(o[1])), bool(f), -1).flatten()
                           for o, f in zip(offsets, flips)])
    return Views(tuple(grid), offsets, torch.from_numpy(flips.astype(bool)), sources)


def view_of(x: torch.Tensor, offset: Tuple[int, int], flip: bool, fill) -> torch.Tensor:
    """``x`` [..., H, W] moved by ``-offset`` (``out[y, x] = in[y + dy, x + dx]``; uncovered cells ``fill``, a number
    or a tensor broadcastable to ``x[..., :1, :1]``) and flipped left-right when ``flip``."""
    dy, dx = offset
    h, w = x.shape[-2:]
    out = torch.empty_like(x)
    out[...] = torch.as_tensor(fill, dtype=x.dtype, device=x.device)
    src_y, src_x = slice(max(0, dy), min(h, h + dy)), slice(max(0, dx), min(w, w + dx))
    dst_y = slice(src_y.start - dy, src_y.stop - dy)
    dst_x = slice(src_x.start - dx, src_x.stop - dx)
    out[..., dst_y, dst_x] = x[..., src_y, src_x]
    return out.flip(-1) if flip else out


def view_images(images: torch.Tensor, views: Views, k: int, patch: Sequence[int], fill: torch.Tensor) -> torch.Tensor:
    """View ``k`` of ``images`` [b, 3, H, W]: shifted by whole patches of ``patch`` (ph, pw) pixels, uncovered pixels
    ``fill`` [3] (the model's normalised white), flipped as the view says."""
    dy, dx = (int(v) for v in views.offsets[k])
    return view_of(images, (dy * int(patch[0]), dx * int(patch[1])), bool(views.flips[k]),
                   fill.to(images.dtype).view(3, 1, 1))


def recover(features: Sequence[torch.Tensor], views: Views) -> torch.Tensor:
    """Per-view patch values ``features[k]`` [b, P, ...] put back on the image's grid and averaged over the views
    that cover each patch: [b, P, ...]."""
    total = torch.zeros_like(features[0], dtype=torch.float64)
    count = torch.zeros(features[0].shape[1], dtype=torch.float64)
    for k, f in enumerate(features):
        src = views.sources[k]
        valid = src >= 0
        total.index_add_(1, src[valid], f[:, valid].double())
        count.index_add_(0, src[valid], torch.ones(int(valid.sum()), dtype=torch.float64))
    shape = (1, -1) + (1,) * (total.dim() - 2)
    return (total / count.clamp_min(1).view(shape)).to(features[0].dtype)
