"""Oracle: PH-Reg's test-time-augmentation teacher (Yan et al., NeurIPS 2025).

Transcribes ``0raiser0/PH-Reg`` (commit 5910d50fdf18a1ccc9dd6b56823299a25cae29b6): ``DINOv2_full/utils/denoising.py``
(``prepare_patch_idxs``, ``prepare_flip``, ``prepare_all_offsets``, ``farthest_point_sample``, ``shuffle_shift``),
the per-view loop of ``DINOv2_full/datasets/flickr30k_dataset.py`` (``Flickr30Dataset.__getitem__``: shift by whole
patches, fill -100 then ImageNet-normalised white, flip; the patch-index grid moved alike with fill -1) and
``DINOv2_full/models/teacherDINOv2.py`` (``recover_images`` and the sum over views divided by the contributions).
The reference's three random seeds are passed in. Only a test oracle, never imported by ``interp``.
"""
from __future__ import annotations

import numpy as np
import torch

WHITE = torch.tensor([2.2489083, 2.42857143, 2.64])  # the reference's fill: (1 - mean) / std for ImageNet


def patch_grid(n: int) -> torch.Tensor:
    return torch.stack(torch.meshgrid(torch.arange(n, dtype=torch.int32), torch.arange(n, dtype=torch.int32),
                                      indexing="ij"), dim=0)


def flips(counts: int, seed: int) -> np.ndarray:
    f = np.random.default_rng(seed=seed).integers(0, 2, counts)
    f[0] = 0
    return f


def all_offsets(n: int, shift_frac: float, counts: int, seed: int) -> torch.Tensor:
    s = int(round(shift_frac * n))
    rng = np.random.default_rng(seed=seed)
    xs = rng.integers(-s, s, size=counts * 10, endpoint=True)
    ys = rng.integers(-s, s, size=counts * 10, endpoint=True)
    return torch.from_numpy(np.stack([xs, ys], axis=1)[None]).float()


def farthest_point_sample(points: torch.Tensor, num: int, seed: int) -> torch.Tensor:
    b, n, _ = points.shape
    picked = torch.zeros(b, num, dtype=torch.long)
    distance = torch.full((b, n), float("inf"))
    torch.manual_seed(seed)
    farthest = torch.randint(low=0, high=n, size=(b,), dtype=torch.long)
    rows = torch.arange(b)
    for i in range(num):
        picked[:, i] = farthest
        centre = points[rows, farthest, :].view(b, 1, 2)
        d = torch.sum((points - centre) ** 2, dim=-1)
        closer = d < distance
        distance[closer] = d[closer]
        farthest = torch.max(distance, dim=-1)[1]
    return picked


def shuffle_shift(x: torch.Tensor, dy: int, dx: int, infill: float) -> torch.Tensor:
    _, h, w = x.shape
    lo_h, up_h = max(0, dy), min(h, h + dy)
    lo_w, up_w = max(0, dx), min(w, w + dx)
    out = torch.full_like(x, fill_value=infill)
    out[:, lo_h - dy:up_h - dy, lo_w - dx:up_w - dx] = x[:, lo_h:up_h, lo_w:up_w]
    return out


def views(img: torch.Tensor, patch: int, counts: int, shift_frac: float, seeds):
    """The dataset item: (view images [counts, 3, H, W], index grids [counts, 2, n, n], offsets [counts, 2])."""
    n = img.shape[-1] // patch
    candidates = all_offsets(n, shift_frac, counts, seeds[0])
    flip = flips(counts, seeds[1])
    chosen = farthest_point_sample(candidates, counts, seeds[2])
    offsets = candidates[0, chosen[0], :].numpy().astype(np.int32)
    offsets[0] = [0, 0]
    grid = patch_grid(n)
    imgs, idxs = [], []
    for i in range(counts):
        dy, dx = offsets[i]
        shifted = shuffle_shift(img, int(dy) * patch, int(dx) * patch, infill=-100)
        if flip[i] == 1:
            shifted = torch.flip(shifted, dims=[2])
        imgs.append(torch.where(shifted < -50, WHITE.view(3, 1, 1), shifted))
        idx = shuffle_shift(grid, int(dy), int(dx), infill=-1)
        if flip[i] == 1:
            idx = torch.flip(idx, dims=[2])
        idxs.append(idx)
    return torch.stack(imgs), torch.stack(idxs), offsets, flip


def recover(feats: torch.Tensor, idxs: torch.Tensor) -> torch.Tensor:
    """``feats`` [counts, n, n, d] of one image's views, ``idxs`` [counts, 2, n, n] -> the averaged map [n, n, d]."""
    maps = torch.zeros_like(feats)
    contrib = torch.zeros(feats.shape[:3], dtype=feats.dtype)
    valid = (idxs >= 0).all(dim=1)
    b, h, w = valid.nonzero(as_tuple=True)
    xs, ys = idxs[b, 0, h, w].long(), idxs[b, 1, h, w].long()
    maps[b, xs, ys] = feats[b, h, w]
    contrib[b, xs, ys] = 1
    return maps.sum(0) / contrib.sum(0).unsqueeze(-1)
