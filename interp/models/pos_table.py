"""Resampling a checkpoint's absolute position table to the model's patch grid, the way its authors did.

timm resamples a table once, at load time (``F.interpolate(size=grid, bicubic, antialias=True)``). DINOv2
resamples it at every forward (``interpolate_pos_encoding`` in facebookresearch/dinov2,
``dinov2/models/vision_transformer.py``), in float32 and bicubic, in one of two ways:

* ``"dinov2"`` (the models without registers, ``interpolate_offset=0.1``, ``interpolate_antialias=False``):
  a *scale factor* ``(g + 0.1) / M`` per axis (M = the table's side, g = the grid's side), no antialias.
  PyTorch then maps output pixel i to input ``(i + 0.5) * M / (g + 0.1) - 0.5``, not ``... * M / g``: the
  sampled positions differ from timm's even where both agree on the output size;
* ``"dinov2_reg"`` (the ``_reg`` models, ``interpolate_offset=0``, ``interpolate_antialias=True``): an output
  *size* ``(g_h, g_w)`` with antialias, i.e. timm's arithmetic.

An interp model has a fixed input size, and DINOv2's table at a given size is a function of that size only, so
resampling it once here gives DINOv2's forward at that size. The CLS row (and, in timm's layout, every prefix
row) is kept as it is.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError

POS_RESAMPLE_METHODS = ("timm", "dinov2", "dinov2_reg")
POS_RESAMPLE_CHOICES = ("auto",) + POS_RESAMPLE_METHODS


def resample_pos_table(pos: torch.Tensor, grid: Tuple[int, int], n_prefix: int, method: str) -> torch.Tensor:
    """A position table ``[1, n_prefix + M*M, d]`` resampled to ``[1, n_prefix + g_h*g_w, d]`` by ``method``.

    Computed in float32 and returned in ``pos``'s dtype. ``n_prefix`` rows (CLS) are not resampled.
    """
    if method not in POS_RESAMPLE_METHODS:
        raise ValueError(f"unknown position-table resampling {method!r}; use one of {POS_RESAMPLE_METHODS}")
    prefix, table = pos[:, :n_prefix], pos[:, n_prefix:]
    n, dim = int(table.shape[1]), int(table.shape[-1])
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"the position table holds {n} patch rows: not a square grid")
    gh, gw = int(grid[0]), int(grid[1])
    square = table.float().reshape(1, side, side, dim).permute(0, 3, 1, 2)
    if method == "dinov2":
        out = F.interpolate(square, scale_factor=(float(gh + 0.1) / side, float(gw + 0.1) / side),
                            mode="bicubic", antialias=False)
    else:  # "dinov2_reg" and "timm": an output size, antialiased
        out = F.interpolate(square, size=(gh, gw), mode="bicubic", antialias=True)
    if tuple(out.shape[-2:]) != (gh, gw):  # DINOv2 asserts the same: the offset keeps floor((g+0.1)/M*M) = g
        raise ValueError(f"resampling gave a {tuple(out.shape[-2:])} grid, not {(gh, gw)}")
    out = out.permute(0, 2, 3, 1).reshape(1, gh * gw, dim).to(pos.dtype)
    return torch.cat([prefix, out], dim=1)


def resample_positions(model: nn.Module, state_dict: dict, source_grid: Optional[Tuple[int, int]], choice: str,
                       label: str) -> Tuple[dict, Optional[str]]:
    """The state dict with its ``pos_embed`` (trained for ``source_grid``) resampled to ``model``'s patch grid
    by ``choice``, and the method used (None when the table already fits or its grid is unknown).

    ``"auto"``: DINOv2's own arithmetic for an original DINOv2 file (``mask_token`` key: ``"dinov2"``, or
    ``"dinov2_reg"`` when it holds ``register_tokens``), timm's for any other file. ``"timm"`` leaves the table
    to timm's checkpoint filter. An original DINOv2 table has one prefix row (CLS); a timm one has the model's.
    """
    target = tuple(int(g) for g in model.patch_embed.grid_size)
    if source_grid is None or tuple(source_grid) == target:
        return state_dict, None
    dinov2_file = "mask_token" in state_dict
    method = choice if choice != "auto" else (
        ("dinov2_reg" if "register_tokens" in state_dict else "dinov2") if dinov2_file else "timm")
    if method == "timm":
        return state_dict, method
    if not isinstance(state_dict.get("pos_embed"), torch.Tensor):
        raise ModelLoadError(f"pos_resample={method!r} resamples a DINOv2 or timm 'pos_embed'; {label} keeps its "
                             "position table under another key: pass pos_resample='timm' (CLI --pos-resample timm)")
    timm_prefix = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 1))
    state_dict = dict(state_dict)
    state_dict["pos_embed"] = resample_pos_table(state_dict["pos_embed"], target, 1 if dinov2_file else timm_prefix,
                                                 method)
    return state_dict, method
