"""Test oracle: DINOv3's rotary position encoding (RoPE), transcribed from the DINOv3 repository.

Follows repo ``facebookresearch/dinov3`` at commit ``6876159a11b4df116f30f667f8c9888617df0751``:

* ``dinov3/layers/rope_position_encoding.py``, ``RopePositionEmbedding``:

  - periods, one per quarter of a head (``D_head // 4``), in the module's ``dtype``: with ``base``,
    ``base ** (2 j / (D_head // 2))``; with ``min_period``/``max_period``, ``r ** linspace(0, 1, D_head // 4)``
    with ``r = max_period / min_period``, divided by ``r``, times ``max_period``. The buffer is persistent, so a
    loaded checkpoint's values replace the computed ones;
  - coordinates for an ``H x W`` patch grid, in the module's ``dtype``: ``arange(0.5, n) / denom`` per axis, with
    ``denom`` = ``max(H, W)`` (``"max"``), ``min(H, W)`` (``"min"``) or the axis' own size (``"separate"``, the
    default), meshgrid ``indexing="ij"`` (row coordinate first), flattened row-major, then ``2 c - 1``;
  - ``shift_coords``, ``jitter_coords``, ``rescale_coords`` are drawn only when ``self.training``: at eval the
    coordinates are exactly the above;
  - angles ``2 pi c / period`` [HW, 2, D_head // 4], flattened to [HW, D_head // 2] (all row angles, then all
    column angles), tiled twice to [HW, D_head]; returns ``(sin, cos)``;
* ``dinov3/layers/attention.py``, ``rope_rotate_half`` / ``rope_apply`` / ``SelfAttention.apply_rope``: q and k
  [B, heads, N, D_head] are cast to the dtype of ``sin``; the first ``N - HW`` tokens (CLS and the storage tokens)
  are left as they are, the last ``HW`` become ``x * cos + rotate_half(x) * sin`` with
  ``rotate_half([x1, x2]) = [-x2, x1]`` (halves of the head dimension); then cast back to q's / k's dtype;
* ``dinov3/models/vision_transformer.py`` (``DinoVisionTransformer``): the table is computed at every forward for
  the input's patch grid ``(H, W)`` = (image height, width) / patch size, ``pos_embed_rope_dtype`` defaults to
  ``"bf16"`` (the training configs), and ``dinov3/hub/backbones.py`` builds the released backbones with
  ``pos_embed_rope_base=100``, ``normalize_coords="separate"``, ``rescale_coords=2`` (training only) and
  ``pos_embed_rope_dtype="fp32"``.

Used ONLY as a test oracle, never by the library.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch


def periods(head_dim: int, base: Optional[float] = 100.0, min_period: Optional[float] = None,
            max_period: Optional[float] = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """DINOv3's RoPE periods [head_dim // 4] in ``dtype`` (``base`` xor ``min_period`` + ``max_period``)."""
    quarter = head_dim // 4
    if base is not None:
        exponent = 2 * torch.arange(quarter, dtype=dtype) / (head_dim // 2)
        return base ** exponent
    ratio = max_period / min_period
    return (ratio ** torch.linspace(0, 1, quarter, dtype=dtype)) / ratio * max_period


def coords(H: int, W: int, normalize_coords: str = "separate", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Patch-centre coordinates [H*W, 2] (row, column) in [-1, 1], row-major, at eval (no shift/jitter/rescale)."""
    denom = {"max": (max(H, W),) * 2, "min": (min(H, W),) * 2, "separate": (H, W)}[normalize_coords]
    rows = torch.arange(0.5, H, dtype=dtype) / denom[0]
    cols = torch.arange(0.5, W, dtype=dtype) / denom[1]
    grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).reshape(H * W, 2)
    return 2.0 * grid - 1.0


def sin_cos(H: int, W: int, period: torch.Tensor, normalize_coords: str = "separate",
            dtype: torch.dtype = torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """DINOv3's ``(sin, cos)``, each [H*W, head_dim], for an ``H x W`` grid, computed in ``dtype`` (the module's
    dtype; ``period`` is cast to it, as a loaded buffer is)."""
    c = coords(H, W, normalize_coords, dtype)
    angles = 2 * math.pi * c[:, :, None] / period.to(dtype)[None, None, :]  # [HW, 2, dh/4]
    angles = angles.reshape(H * W, -1)  # [HW, dh/2]: row angles, then column angles
    angles = torch.cat([angles, angles], dim=-1)  # [HW, dh]
    return torch.sin(angles), torch.cos(angles)


def rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` over the last axis, ``rotate_half([a, b]) = [-b, a]``."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


def apply_rope(q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """DINOv3's ``SelfAttention.apply_rope``: q, k [B, heads, N, dh]; the last ``sin.shape[0]`` tokens (the patches)
    are rotated in ``sin``'s dtype, the leading prefix tokens kept; results in q's and k's own dtypes."""
    out = []
    for x in (q, k):
        n_prefix = x.shape[-2] - sin.shape[-2]
        assert n_prefix >= 0
        y = x.to(sin.dtype)
        y = torch.cat([y[..., :n_prefix, :], rotate(y[..., n_prefix:, :], sin, cos)], dim=-2)
        out.append(y.to(x.dtype))
    return out[0], out[1]
