"""What the explorer's session keeps and sends, in small pieces: its bounded caches (edited runs, parsed edits and
readouts, least recent dropped) and the display forms of tensors (rounded nested lists, per-block curves)."""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Dict, List, Sequence

import torch

from ..hooks.names import RESID_STAGES as STAGES

CACHE_SIZE = 64  # edited runs (per image and edit), parsed edits and readouts (per edit) kept, least recent out


def edit_key(spec: Sequence[Dict[str, Any]]) -> str:
    return json.dumps(list(spec), sort_keys=True, separators=(",", ":"))


def lru(cache: "OrderedDict", key, make):
    """``cache[key]``, made with ``make()`` when missing; at most CACHE_SIZE entries, the least recent dropped."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
    return value


def rounded(t: torch.Tensor, digits: int = 5) -> list:
    """A float tensor as nested lists rounded to ``digits`` significant digits (display-only values)."""
    return [float(f"{v:.{digits}g}") for v in t.reshape(-1).tolist()] if t.dim() == 1 else [rounded(r, digits) for r in t]


def curves(norms: Dict[str, List[torch.Tensor]]) -> Dict[str, Dict[str, List[float]]]:
    """Per block max and median (``torch.quantile`` 0.5, as the emergence curves) of each block's patch norms
    (L x [P_l]: a pyramid's blocks have grids of their stage)."""
    return {s: {"max": [float(row.max()) for row in norms[s]],
                "median": [float(torch.quantile(row.double(), 0.5)) for row in norms[s]]} for s in STAGES}
