"""A plain-stack timm model's patch grid, absolute position table and RoPE table, read and set in one place, so
that the weight-file code (:mod:`interp.models.weights`) never reads timm's attributes.

A model has positions when its patch embedding has a fixed grid (timm ``patch_embed.grid_size``): ViT, Eva,
Swin-v2; PVTv2's overlapping embedding takes any size and has none (:func:`positions_of` gives None). The
absolute table (``pos_embed``, [1, n_prefix + h * w, d]) may be absent (Swin-v2, RoPE-only Eva such as DINOv3).

>>> positions = positions_of(model.timm_model)
>>> positions.grid, positions.patch_size, positions.n_prefix, tuple(positions.table.shape)
((14, 14), (16, 16), 1, (1, 197, 192))
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

import torch
from torch import nn


class Positions:
    """The patch grid and position tables of one timm module (see the module docstring).

    Attributes:
        module: the timm model.
    """

    def __init__(self, module: nn.Module):
        self.module = module

    @property
    def grid(self) -> Tuple[int, int]:
        """(h, w): the patch grid the model is built for."""
        return tuple(int(g) for g in self.module.patch_embed.grid_size)

    @property
    def patch_size(self) -> Tuple[int, int]:
        """(ph, pw): input pixels per patch."""
        return tuple(int(p) for p in self.module.patch_embed.patch_size)

    @property
    def img_size(self) -> Tuple[int, int]:
        """(H, W): the input size the model is built for."""
        return tuple(int(s) for s in self.module.patch_embed.img_size)

    @property
    def table(self) -> Optional[torch.Tensor]:
        """The absolute position table [1, n_prefix + h * w, d], None when the model has none."""
        return getattr(self.module, "pos_embed", None)

    @property
    def n_prefix(self) -> int:
        """Rows of the table before its patch rows: the prefix tokens (CLS, registers) that carry a position;
        0 for timm's ``no_embed_class`` layout, which adds none to them."""
        if getattr(self.module, "no_embed_class", False):
            return 0
        return int(getattr(self.module, "num_prefix_tokens", 1))

    @property
    def resizable(self) -> bool:
        """Whether timm can rebuild the model for another input size (``set_input_size``)."""
        return hasattr(self.module, "set_input_size")

    def resize(self, img_size: Tuple[int, int]) -> None:
        """Rebuild the model for inputs of ``img_size`` (timm ``set_input_size``: the table resampled by timm)."""
        self.module.set_input_size(img_size=tuple(img_size))

    @contextmanager
    def at_grid(self, grid: Tuple[int, int], table: Optional[torch.Tensor]) -> Iterator[None]:
        """Inside, the model takes inputs of ``grid * patch_size`` pixels: its position table is ``table`` (for a
        model with one), its patch embedding's size is that grid's, and a RoPE table cached for the built grid
        is timm's for ``grid``; all restored on exit. Changes the model in place: one grid at a time."""
        m, pe = self.module, self.module.patch_embed
        (ph, pw), (h, w) = self.patch_size, (int(grid[0]), int(grid[1]))
        own_table, saved = self.table, (pe.img_size, pe.grid_size, pe.num_patches)
        rope = getattr(m, "rope", None)  # a RoPE table cached for the built grid (timm's Eva without dynamic size)
        rope_cached = getattr(rope, "feat_shape", None) is not None and hasattr(rope, "update_feat_shape")
        try:
            if rope_cached:
                rope.update_feat_shape((h, w))
            if own_table is not None:
                m.pos_embed = nn.Parameter(table, requires_grad=False)
            pe.img_size, pe.grid_size, pe.num_patches = (h * ph, w * pw), (h, w), h * w
            yield
        finally:
            pe.img_size, pe.grid_size, pe.num_patches = saved
            if own_table is not None:
                m.pos_embed = own_table
            if rope_cached:
                rope.update_feat_shape(tuple(int(g) for g in saved[1]))

    def rope_embed(self, grid: Tuple[int, int]) -> Optional[torch.Tensor]:
        """The RoPE table the model rotates the patches of ``grid`` with (timm ``rope.get_embed``): [h * w, 2 * r],
        the sines of the r rotated dims' angles, then their cosines; None without RoPE."""
        rope = getattr(self.module, "rope", None)
        return None if rope is None else rope.get_embed(shape=list(grid))

    def rope_periods(self) -> Optional[torch.Tensor]:
        """The RoPE periods [head_dim // 4] the model rotates with (timm ``rope.periods``), None without RoPE."""
        periods = getattr(getattr(self.module, "rope", None), "periods", None)
        return periods if isinstance(periods, torch.Tensor) else None

    @torch.no_grad()
    def set_rope_periods(self, periods: torch.Tensor) -> None:
        """Rotate with ``periods`` (copied in the model's dtype); a RoPE table cached for a fixed size follows."""
        rope, target = self.module.rope, self.rope_periods()
        target.copy_(periods.to(dtype=target.dtype, device=target.device))
        if getattr(rope, "pos_embed_cached", None) is not None and getattr(rope, "feat_shape", None) is not None:
            rope._cache_embed(list(rope.feat_shape))


def positions_of(module: nn.Module) -> Optional[Positions]:
    """The :class:`Positions` of a timm module with a fixed patch grid, None for one without (PVTv2)."""
    pe = getattr(module, "patch_embed", None)
    return Positions(module) if getattr(pe, "grid_size", None) is not None else None
