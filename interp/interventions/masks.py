"""Boolean patch-grid masks [h, w] for :class:`~interp.interventions.Relocation` targets.

``grid`` is the patch grid ``(h, w)`` (``model.layout.grid``). Row 0 is the top of the image.

>>> from interp.interventions import masks
>>> masks.box((14, 14), top=2, left=3, height=4, width=5).sum()
tensor(20)
>>> masks.from_string('''
... .#.
... ###
... ''').shape
torch.Size([2, 3])

Relocation targets have one grammar, :func:`parse_target`, for the CLI text and the JSON spec alike:
``NAME`` or ``NAME:ARGS`` as text equals ``{"NAME": [ARGS]}`` in JSON, NAME one of :data:`TARGET_FORMS`
(``smiley``, ``box:TOP,LEFT,HEIGHT,WIDTH``, ``indices:I,J,...``); besides, ASCII rows (a string of several
lines or a list of row strings) and a 0/1 grid (nested list or tensor).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple, Union

import torch

Grid = Tuple[int, int]


def _check_grid(grid: Sequence[int]) -> Grid:
    h, w = (int(g) for g in grid)
    if h < 1 or w < 1:
        raise ValueError(f"grid must be (rows, cols) >= 1, got {tuple(grid)}")
    return h, w


def empty(grid: Sequence[int]) -> torch.Tensor:
    """All-False mask [h, w]."""
    return torch.zeros(_check_grid(grid), dtype=torch.bool)


def box(grid: Sequence[int], top: int, left: int, height: int, width: int) -> torch.Tensor:
    """Rectangle of ``height`` x ``width`` cells whose top-left cell is (``top``, ``left``). -> [h, w] bool."""
    h, w = _check_grid(grid)
    if not (0 <= top and 0 <= left and height >= 1 and width >= 1 and top + height <= h and left + width <= w):
        raise ValueError(f"box top={top} left={left} height={height} width={width} does not fit the grid {h}x{w}")
    mask = empty((h, w))
    mask[top:top + height, left:left + width] = True
    return mask


def from_indices(grid: Sequence[int], indices: Iterable[Union[int, Sequence[int]]]) -> torch.Tensor:
    """Cells given as flat patch indices (row-major, as on the token axis) or (row, col) pairs. -> [h, w] bool."""
    h, w = _check_grid(grid)
    mask = empty((h, w))
    for item in indices:
        if isinstance(item, (int, torch.Tensor)) and not (isinstance(item, torch.Tensor) and item.numel() > 1):
            flat = int(item)
            if not 0 <= flat < h * w:
                raise ValueError(f"patch index {flat} is outside the {h}x{w} grid (0..{h * w - 1})")
            mask.view(-1)[flat] = True
        else:
            r, c = (int(v) for v in item)
            if not (0 <= r < h and 0 <= c < w):
                raise ValueError(f"cell ({r}, {c}) is outside the {h}x{w} grid")
            mask[r, c] = True
    return mask


def from_string(art: str, on: str = "#Xx1@*") -> torch.Tensor:
    """ASCII art -> mask: one text line per grid row, a character in ``on`` marks a cell (others are off).

    Blank leading/trailing lines are ignored; all rows must have the same length.
    """
    rows = [line.strip() for line in art.strip("\n").splitlines() if line.strip()]
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError("ascii mask needs at least one row and rows of equal length")
    return torch.tensor([[ch in on for ch in row] for row in rows], dtype=torch.bool)


def smiley(grid: Sequence[int]) -> torch.Tensor:
    """A smiley face scaled to the grid: two eyes and a mouth (an arc of cells). -> [h, w] bool.

    Needs a grid of at least 5 x 5.
    """
    h, w = _check_grid(grid)
    if h < 5 or w < 5:
        raise ValueError(f"a smiley needs a grid of at least 5x5, got {h}x{w}")
    mask = empty((h, w))
    eye_row = round(0.3 * (h - 1))
    mask[eye_row, round(0.3 * (w - 1))] = True
    mask[eye_row, round(0.7 * (w - 1))] = True
    # Mouth: the lower half of an ellipse centred below the eyes.
    cy, cx = 0.55 * (h - 1), (w - 1) / 2
    ry, rx = 0.3 * (h - 1), 0.3 * (w - 1)
    n_steps = 4 * max(h, w)
    for i in range(n_steps + 1):
        angle = math.pi * (0.15 + 0.7 * i / n_steps)  # from lower right to lower left
        r, c = round(cy + ry * math.sin(angle)), round(cx + rx * math.cos(angle))
        mask[r, c] = True
    return mask


def to_string(mask: torch.Tensor, on: str = "#", off: str = ".") -> str:
    """Mask [h, w] -> ASCII art (inverse of :func:`from_string`)."""
    return "\n".join("".join(on if bool(v) else off for v in row) for row in mask)


#: Named target forms: name -> fn(grid, args) -> Bool[h, w]; text ``name:a,b,c`` == JSON ``{"name": [a, b, c]}``.
TARGET_FORMS: Dict[str, Callable[[Grid, Sequence[Any]], torch.Tensor]] = {
    "smiley": lambda grid, args: smiley(grid),
    "box": lambda grid, args: box(grid, *args),
    "indices": lambda grid, args: from_indices(grid, args),
}
TARGET_SYNTAX = ("smiley, box:TOP,LEFT,HEIGHT,WIDTH, indices:I,J,... (flat patch indices), ASCII rows, or a "
                 "0/1 grid (JSON: {\"box\": [...]}, {\"indices\": [...]} also take [row, col] pairs)")


def parse_target(target: Any, grid: Optional[Sequence[int]]) -> torch.Tensor:
    """A relocation target in any form of the one grammar (module docstring) -> Bool[h, w] on ``grid``.

    ``None`` means ``smiley``. ``grid`` (``model.layout.grid``) is needed by the named forms; explicit masks
    (ASCII rows, 0/1 grids) carry their own shape.

    >>> parse_target("box:2,2,3,3", (14, 14)).sum()
    tensor(9)
    >>> bool((parse_target({"indices": [0, [1, 1]]}, (4, 4)) == parse_target("indices:0,5", (4, 4))).all())
    True

    Raises:
        ValueError: an unknown form, bad arguments, a named form without ``grid``, or a cell off the grid.
    """
    if target is None:
        target = "smiley"
    if isinstance(target, str) and "\n" not in target.strip():
        name, sep, args = target.strip().partition(":")
        if name.strip().lower() in TARGET_FORMS:
            try:
                values = [int(v) for v in args.split(",") if v.strip()] if sep else []
            except ValueError:
                raise ValueError(f"target {target!r}: arguments must be integers; expected {TARGET_SYNTAX}") from None
            return _named_target(name.strip().lower(), values, grid)
        raise ValueError(f"unknown target {target!r}; expected {TARGET_SYNTAX}")
    if isinstance(target, dict):
        if len(target) != 1 or next(iter(target)) not in TARGET_FORMS:
            raise ValueError(f"unknown target form {sorted(target)}; expected {TARGET_SYNTAX}")
        (name, values), = target.items()
        return _named_target(name, list(values or []), grid)
    if isinstance(target, str):
        return from_string(target)
    if isinstance(target, (list, tuple)) and target and all(isinstance(r, str) for r in target):
        return from_string("\n".join(target))
    mask = torch.as_tensor(target).bool()
    if mask.dim() != 2:
        raise ValueError(f"target grid must be 2-D [h, w], got shape {tuple(mask.shape)}; expected {TARGET_SYNTAX}")
    return mask


def _named_target(name: str, values: Sequence[Any], grid: Optional[Sequence[int]]) -> torch.Tensor:
    if grid is None:
        raise ValueError(f"target {name!r} needs the model's patch grid (give the model)")
    if name == "box" and len(values) != 4:
        raise ValueError(f"target box needs TOP,LEFT,HEIGHT,WIDTH (4 integers), got {list(values)}")
    if name == "indices" and not values:
        raise ValueError(f"target indices needs at least one patch index on the {grid[0]}x{grid[1]} grid")
    return TARGET_FORMS[name](_check_grid(grid), values)
