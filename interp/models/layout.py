"""Token layout of a timm ViT: which rows of the token axis are CLS, registers and patches.

Everything is read from the model (``num_prefix_tokens``, ``cls_token``, ``reg_token``,
``patch_embed``), never guessed from its name.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class TokenLayout:
    """Where each kind of token sits on the token axis ``t`` of ``[b, t, d]`` activations.

    Token order is always ``[CLS?, registers..., extra (test-time) registers..., patches...]``.

    Attributes:
        n_prefix: number of prefix tokens (CLS + trained registers + test-time registers).
        n_registers: trained register tokens (e.g. 4 for ``*_reg4_*`` models).
        cls_index: row of the CLS token, or None for models without one.
        grid: patch grid ``(h, w)`` for the input size this layout describes.
        n_extra: test-time registers appended by an intervention (counted in ``n_prefix``).
    """

    n_prefix: int
    n_registers: int
    cls_index: Optional[int]
    grid: Tuple[int, int]
    n_extra: int = 0

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def n_tokens(self) -> int:
        return self.n_prefix + self.n_patches

    @property
    def grid_hw(self) -> Tuple[int, int]:
        return self.grid

    @property
    def register_slice(self) -> slice:
        """Rows of trained and test-time registers."""
        start = 0 if self.cls_index is None else 1
        return slice(start, self.n_prefix)

    @property
    def patch_slice(self) -> slice:
        return slice(self.n_prefix, self.n_prefix + self.n_patches)

    def with_extra(self, n_extra: int) -> "TokenLayout":
        """The layout after ``n_extra`` test-time registers are appended after the prefix tokens."""
        return TokenLayout(
            n_prefix=self.n_prefix - self.n_extra + n_extra,
            n_registers=self.n_registers,
            cls_index=self.cls_index,
            grid=self.grid,
            n_extra=n_extra,
        )

    def with_grid(self, grid: Tuple[int, int]) -> "TokenLayout":
        return TokenLayout(self.n_prefix, self.n_registers, self.cls_index, tuple(grid), self.n_extra)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["grid"] = list(self.grid)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TokenLayout":
        return cls(
            n_prefix=int(d["n_prefix"]),
            n_registers=int(d["n_registers"]),
            cls_index=None if d.get("cls_index") is None else int(d["cls_index"]),
            grid=tuple(int(g) for g in d["grid"]),
            n_extra=int(d.get("n_extra", 0)),
        )


def grid_for(timm_model, img_size: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """Patch grid ``(h, w)`` of ``timm_model`` for an input of ``img_size`` (default: its own)."""
    pe = timm_model.patch_embed
    if img_size is None:
        return tuple(int(g) for g in pe.grid_size)
    if hasattr(pe, "dynamic_feat_size"):
        return tuple(int(g) for g in pe.dynamic_feat_size(tuple(img_size)))
    ph, pw = pe.patch_size
    return (img_size[0] // ph, img_size[1] // pw)


def read_layout(timm_model, img_size: Optional[Tuple[int, int]] = None) -> TokenLayout:
    """Read the token layout from a timm VisionTransformer."""
    n_prefix = int(getattr(timm_model, "num_prefix_tokens", 0))
    n_registers = int(getattr(timm_model, "num_reg_tokens", 0) or 0)
    has_cls = getattr(timm_model, "cls_token", None) is not None
    return TokenLayout(
        n_prefix=n_prefix,
        n_registers=n_registers,
        cls_index=0 if has_cls else None,
        grid=grid_for(timm_model, img_size),
    )
