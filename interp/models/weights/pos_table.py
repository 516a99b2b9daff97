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

``transformers`` (``interpolate_pos_encoding`` of its ViT, DINOv2, CLIP and SigLIP embeddings, 5.x) resamples to
the output *size* ``(h, w)``, bicubic, corners not aligned and **no antialias**: ``"transformers"`` (its
``Dinov2WithRegisters`` antialiases: ``"dinov2_reg"``). It runs in float32 for DINOv2 and in the table's dtype for
ViT, CLIP and SigLIP, which is the same for the float32 tables interp resamples.

An interp model has a fixed input size, and DINOv2's table at a given size is a function of that size only, so
resampling it once here gives DINOv2's forward at that size. The CLS row (and, in timm's layout, every prefix
row) is kept as it is.

For LOST's protocol (one full-resolution image at a time) a table is resampled per input grid, as DINO
(v1) does it on the fly: :func:`dino_pos_table` and the context :func:`input_grid`.

DINO (``facebookresearch/dino`` ``vision_transformer.py``, ``VisionTransformer.interpolate_pos_encoding``, commit
04c0ad957c9f; the models LOST runs) resamples its square ``M x M`` patch table for an ``h x w`` grid thus:

* the table is returned unchanged when the grid is the table's own (its ``npatch == N and w == h``);
* otherwise the prefix row (CLS) is kept and the patch rows, as a ``[1, D, M, M]`` image, go through
  ``F.interpolate(mode="bicubic", scale_factor=((h + 0.1) / M, (w + 0.1) / M))`` (no antialias, corners not
  aligned). The output is ``floor(M * (g + 0.1) / M) = g`` cells per axis; because the *scale factor* (not the
  size) is given, torch samples the source at ``(i + 0.5) / s - 0.5`` with ``s = (g + 0.1) / M``, which is not
  ``size=(h, w)``'s ``(i + 0.5) * M / g - 0.5``: the two differ (timm's ``resample_abs_pos_embed`` takes the
  size, and antialiases).

DINOv2 (``facebookresearch/dinov2`` ``models/vision_transformer.py``) uses the same call with its
``interpolate_offset`` (0.1) and ``interpolate_antialias`` (True for the ``_reg`` models, which give
``size=`` instead of an offset): :func:`dino_pos_table` takes both as arguments.

>>> table = torch.randn(1, 1 + 14 * 14, 8)                    # CLS row + a 14 x 14 table
>>> dino_pos_table(table, (14, 14), (20, 31), n_prefix=1).shape
torch.Size([1, 621, 8])
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ModelLoadError
from ..families.positions import positions_of

POS_RESAMPLE_METHODS = ("timm", "dinov2", "dinov2_reg", "transformers")
POS_RESAMPLE_CHOICES = ("auto",) + POS_RESAMPLE_METHODS
DINO_OFFSET = 0.1


def dino_pos_table(pos_embed: torch.Tensor, table_grid: Tuple[int, int], grid: Tuple[int, int], n_prefix: int = 1,
                   offset: Optional[float] = DINO_OFFSET, antialias: bool = False) -> torch.Tensor:
    """DINO's ``interpolate_pos_encoding`` (module docstring) for a table of any grid.

    Args:
        pos_embed: [1, n_prefix + gh * gw, D], the table of a ``table_grid = (gh, gw)`` grid, prefix rows first.
        grid: the input's patch grid ``(h, w)``.
        n_prefix: rows of ``pos_embed`` before the patch rows (1 for a CLS row, 0 for ``no_embed_class``).
        offset: added to the grid before dividing by the table's grid (DINO: 0.1); None gives ``size=grid``.
        antialias: F.interpolate's antialias (DINO: False; DINOv2's ``_reg`` models: True).

    Returns:
        [1, n_prefix + h * w, D] in ``pos_embed``'s dtype (the interpolation runs in float32).
    """
    gh, gw = (int(g) for g in table_grid)
    h, w = (int(g) for g in grid)
    if (h, w) == (gh, gw):
        return pos_embed
    prefix, patches = pos_embed[:, :n_prefix], pos_embed[:, n_prefix:]
    dim = patches.shape[-1]
    image = patches.float().reshape(1, gh, gw, dim).permute(0, 3, 1, 2)
    if offset is None:
        out = F.interpolate(image, size=(h, w), mode="bicubic", antialias=antialias)
    else:
        out = F.interpolate(image, scale_factor=((h + offset) / gh, (w + offset) / gw), mode="bicubic",
                            antialias=antialias)
    if tuple(out.shape[-2:]) != (h, w):  # DINO asserts the same
        raise ValueError(f"resampling the {gh}x{gw} position table gave {tuple(out.shape[-2:])}, not {(h, w)}")
    out = out.permute(0, 2, 3, 1).reshape(1, h * w, dim).to(pos_embed.dtype)
    return torch.cat([prefix, out], dim=1)


@contextmanager
def input_grid(model, grid: Tuple[int, int], offset: Optional[float] = DINO_OFFSET,
               antialias: bool = False) -> Iterator[None]:
    """Inside, the HookedViT ``model`` takes inputs of ``grid * patch size`` pixels: its timm module's position
    table is :func:`dino_pos_table` of its own table for that grid, its patch embedding's ``img_size`` /
    ``grid_size`` are that size, and a RoPE table cached for the built grid is timm's for that grid; all restored
    on exit (:meth:`~interp.models.families.positions.Positions.at_grid`). One grid at a time (the model is
    changed in place)."""
    positions = positions_of(model.timm_model)
    own = positions.table
    table = None if own is None else dino_pos_table(own.detach(), positions.grid, grid, positions.n_prefix, offset,
                                                     antialias)
    with positions.at_grid(grid, table):
        yield


def resample_pos_table(pos: torch.Tensor, grid: Tuple[int, int], n_prefix: int, method: str) -> torch.Tensor:
    """A square position table ``[1, n_prefix + M*M, d]`` resampled to ``[1, n_prefix + g_h*g_w, d]`` by ``method``
    (``"dinov2"``: offset 0.1, no antialias; ``"dinov2_reg"`` and ``"timm"``: the output size, antialiased;
    ``"transformers"``: the output size, not antialiased).

    Computed in float32 and returned in ``pos``'s dtype. ``n_prefix`` rows (CLS) are not resampled.
    """
    if method not in POS_RESAMPLE_METHODS:
        raise ValueError(f"unknown position-table resampling {method!r}; use one of {POS_RESAMPLE_METHODS}")
    n = int(pos.shape[1]) - n_prefix
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"the position table holds {n} patch rows: not a square grid")
    if method == "dinov2":
        return dino_pos_table(pos, (side, side), grid, n_prefix, offset=DINO_OFFSET, antialias=False)
    return dino_pos_table(pos, (side, side), grid, n_prefix, offset=None, antialias=method != "transformers")


def resample_positions(model: nn.Module, state_dict: dict, source_grid: Optional[Tuple[int, int]], choice: str,
                       label: str) -> Tuple[dict, Optional[str]]:
    """The state dict with its ``pos_embed`` (trained for ``source_grid``) resampled to ``model``'s patch grid
    by ``choice``, and the method used (None when the table already fits or its grid is unknown).

    ``"auto"``: DINOv2's own arithmetic for an original DINOv2 file (``mask_token`` key: ``"dinov2"``, or
    ``"dinov2_reg"`` when it holds ``register_tokens``), timm's for any other file. ``"timm"`` leaves the table
    to timm's checkpoint filter. An original DINOv2 table has one prefix row (CLS); a timm one has the model's.
    """
    positions = positions_of(model)
    if source_grid is None or positions is None:  # no position table (PVTv2, Swin-v2), or no square grid fits it
        return state_dict, None
    target = positions.grid
    if tuple(source_grid) == target:
        return state_dict, None
    dinov2_file = "mask_token" in state_dict
    method = choice if choice != "auto" else (
        ("dinov2_reg" if "register_tokens" in state_dict else "dinov2") if dinov2_file else "timm")
    if method == "timm":
        return state_dict, method
    if not isinstance(state_dict.get("pos_embed"), torch.Tensor):
        raise ModelLoadError(f"pos_resample={method!r} resamples a DINOv2 or timm 'pos_embed'; {label} keeps its "
                             "position table under another key: pass pos_resample='timm' (CLI --pos-resample timm)")
    state_dict = dict(state_dict)
    state_dict["pos_embed"] = resample_pos_table(state_dict["pos_embed"], target,
                                                 1 if dinov2_file else positions.n_prefix, method)
    return state_dict, method
