"""Token layout of a timm vision transformer: which rows of the token axis are CLS, registers and patches, and
on which patch grid each block runs.

Everything is read from the model by its family adapter (:mod:`interp.models.families`: ``num_prefix_tokens``,
``cls_token``, ``reg_token``, ``patch_embed``, the stages of a pyramid model), never guessed from its name.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional, Tuple

from ..errors import InterpError

Grid = Tuple[int, int]

# the token kinds each token selection of an SAE (``--tokens``) reads; "registers" are the trained ones
TOKEN_SELECTIONS: Dict[str, Tuple[str, ...]] = {"all": ("cls", "registers", "patches"), "patches": ("patches",),
                                                "cls": ("cls",), "registers": ("registers",)}


@dataclass(frozen=True)
class TokenLayout:
    """Where each kind of token sits on the token axis ``t`` of ``[b, t, d]`` activations.

    Token order is always ``[CLS?, distillation?, registers..., extra (test-time) registers..., patches...]``;
    patches are row-major over the grid.

    Attributes:
        n_prefix: number of prefix tokens (CLS + trained registers + test-time registers).
        n_registers: trained register tokens (e.g. 4 for ``*_reg4_*`` models).
        cls_index: row of the CLS token, or None for models without one.
        grid: patch grid ``(h, w)`` of the model's last blocks (every block's, in a plain ViT) for the input size
            this layout describes.
        n_extra: test-time registers appended by an intervention (counted in ``n_prefix``).
        stage_grids: the grid of each stage of a pyramid model (PVTv2, Swin: blocks of later stages run on
            coarser grids, ``grid`` is the last one); empty when every block runs on ``grid``.
        block_stages: the stage of each block (with ``stage_grids``).
        dist_index: row of a distillation token (DeiT's distilled models: ``[CLS, DIST, patches]``), or None. It
            is a prefix token (counted in ``n_prefix``) but not a register.
    """

    n_prefix: int
    n_registers: int
    cls_index: Optional[int]
    grid: Grid
    n_extra: int = 0
    stage_grids: Tuple[Grid, ...] = ()
    block_stages: Tuple[int, ...] = ()
    dist_index: Optional[int] = None

    @property
    def n_class_tokens(self) -> int:
        """Prefix tokens before the registers: CLS and the distillation token, where the model has them."""
        return int(self.cls_index is not None) + int(self.dist_index is not None)

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def n_tokens(self) -> int:
        return self.n_prefix + self.n_patches

    @property
    def register_slice(self) -> slice:
        """Rows of trained and test-time registers (after CLS and a distillation token)."""
        return slice(self.n_class_tokens, self.n_prefix)

    @property
    def dist_slice(self) -> slice:
        """The distillation token's row (an empty slice without one)."""
        return slice(0, 0) if self.dist_index is None else slice(self.dist_index, self.dist_index + 1)

    @property
    def patch_slice(self) -> slice:
        return slice(self.n_prefix, self.n_prefix + self.n_patches)

    def kind_slices(self) -> Dict[str, slice]:
        """Rows of each token kind: ``{"cls", "registers", "patches"}`` (empty slices for kinds it has none of; a
        distillation token is none of them: :attr:`dist_slice`)."""
        cls = slice(self.cls_index, self.cls_index + 1) if self.cls_index is not None else slice(0, 0)
        return {"cls": cls, "registers": self.register_slice, "patches": self.patch_slice}

    def rows_of(self, tokens: str) -> slice:
        """The rows of the token axis the token selection ``tokens`` (:data:`TOKEN_SELECTIONS`) reads."""
        return selected_rows(tokens, n_prefix=self.n_prefix, n_registers=self.n_registers, cls_index=self.cls_index,
                             dist_index=self.dist_index)

    @property
    def n_stages(self) -> int:
        """Stages of blocks on distinct grids (1 for a plain ViT)."""
        return max(len(self.stage_grids), 1)

    def stage_of(self, layer: int) -> int:
        """The stage block ``layer`` belongs to (0 for every block of a plain ViT)."""
        return self.block_stages[layer] if self.block_stages else 0

    def for_block(self, layer: int) -> "TokenLayout":
        """The layout of the tokens block ``layer`` reads and writes: its stage's grid (this layout itself when
        every block runs on one grid)."""
        if not self.stage_grids:
            return self
        return replace(self, grid=self.stage_grids[self.stage_of(layer)], stage_grids=(), block_stages=())

    def with_extra(self, n_extra: int) -> "TokenLayout":
        """The layout after ``n_extra`` test-time registers are appended after the prefix tokens."""
        return replace(self, n_prefix=self.n_prefix - self.n_extra + n_extra, n_extra=n_extra)

    def to_dict(self) -> dict:
        d = {"n_prefix": self.n_prefix, "n_registers": self.n_registers, "cls_index": self.cls_index,
             "grid": list(self.grid), "n_extra": self.n_extra}
        if self.dist_index is not None:
            d["dist_index"] = self.dist_index
        if self.stage_grids:
            d.update(stage_grids=[list(g) for g in self.stage_grids], block_stages=list(self.block_stages))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TokenLayout":
        return cls(
            n_prefix=int(d["n_prefix"]),
            n_registers=int(d["n_registers"]),
            cls_index=None if d.get("cls_index") is None else int(d["cls_index"]),
            grid=tuple(int(g) for g in d["grid"]),
            n_extra=int(d.get("n_extra", 0)),
            stage_grids=tuple(tuple(int(v) for v in g) for g in d.get("stage_grids", ())),
            block_stages=tuple(int(s) for s in d.get("block_stages", ())),
            dist_index=None if d.get("dist_index") is None else int(d["dist_index"]),
        )


def selected_rows(tokens: str, *, n_prefix: int, n_registers: int, cls_index: Optional[int],
                  dist_index: Optional[int] = None) -> slice:
    """The rows of ``[b, t, d]`` activations that the token selection ``tokens`` reads, given the prefix alone
    (what an SAE ablation restored from a patch file knows): ``all`` every row, ``patches`` the rows after every
    prefix token (test-time registers included) to the end, ``cls`` the CLS row, ``registers`` the trained
    registers (not test-time ones). ``TokenLayout.rows_of`` with the layout's own prefix.

    Raises:
        InterpError: an unknown selection, or a model without the selected kind of token.
    """
    if tokens not in TOKEN_SELECTIONS:
        raise InterpError(f"tokens must be one of {', '.join(TOKEN_SELECTIONS)}, got {tokens!r}")
    if tokens == "all":
        return slice(0, None)
    if tokens == "patches":
        return slice(int(n_prefix), None)
    if tokens == "cls":
        if cls_index is None:
            raise InterpError("--tokens cls: the model has no CLS token")
        return slice(int(cls_index), int(cls_index) + 1)
    first = int(cls_index is not None) + int(dist_index is not None)  # registers follow CLS and distillation
    if not n_registers:
        raise InterpError("--tokens registers: the model has no register tokens")
    return slice(first, first + int(n_registers))
