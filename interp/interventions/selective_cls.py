"""``SelectiveCLS``: the intervention by which the head sees the selective aggregation of the patch tokens.

The arithmetic is :func:`~interp.interventions.selective_aggregation.selective_aggregate`; this module only
puts it in place of timm's pooling (hooked model: ``pool_override``; plain model: ``attn_pool``).

>>> with model.intervene(SelectiveCLS()):               # the LaSt reference: score "code", fft "shift", k = 1
...     logits, cache = model.run_with_cache(images, names_filter="hook_selective_votes")
>>> cache["hook_selective_votes"].sum(-1)      # d votes per image for k=1 (width 192)
tensor([192., 192., 192., 192.])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from .base import POOLING, Intervention, check_choice
from .selective_aggregation import DEFAULT_SCORE, FFT_VARIANTS, SCORES, selective_aggregate


class SelectivePool(nn.Module):
    """Pooling module: patch tokens [b, n, d] -> g [b, d] by :func:`selective_aggregate`.

    Works as timm's ``attn_pool`` (``forward``) and as the hooked model's ``edit_state.pool_override``
    (``pool_with_votes``).
    ``skip`` drops leading rows first (for timm models with ``pool_include_prefix=True``).
    """

    def __init__(self, k: int, sigma: Optional[float], score: str, fft: str, eps: float, skip: int = 0):
        super().__init__()
        self.k, self.sigma, self.score, self.fft, self.eps, self.skip = k, sigma, score, fft, eps, int(skip)

    def pool_with_votes(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return selective_aggregate(x[:, self.skip:], self.k, self.sigma, self.score, self.fft, self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool_with_votes(x)[0]

    def extra_repr(self) -> str:
        return f"k={self.k}, sigma={self.sigma}, score={self.score}, fft={self.fft}, eps={self.eps}, skip={self.skip}"


@dataclass(eq=False)
class SelectiveCLS(Intervention):
    """Replace the global vector by selective aggregation (docs/methods.md section 3) of the final patch tokens.

    The aggregation runs on the normed patch tokens (prefix tokens excluded); its result then goes through
    the model's ``fc_norm``, ``head_drop`` and ``head``. Per-patch vote counts go through the hook point
    ``hook_selective_votes`` [b, n_patches].

    ``SelectiveCLS()`` with no arguments is the LaSt reference code (``ChengShiest/LAST-ViT``
    ``cls_pretrain/conf.py``, ``dense_vit``): score ``"code"``, fft ``"shift"``, k = 1, sigma = sqrt(d).

    Args:
        k: patches kept per channel (``k = n_patches`` equals average pooling).
        sigma: low-pass width in frequency bins (None = sqrt(d)).
        score: ``"code"`` (reference code, default), ``"paper"`` (the paper's formula) or ``"contrib"``
            (a contributed script); see :mod:`interp.interventions.selective_aggregation`.
        fft: ``"shift"`` (reference) or ``"rfft"`` (symmetric window).
        eps: epsilon of the ``paper``/``contrib`` scores.
    """

    k: int = 1
    sigma: Optional[float] = None
    score: str = DEFAULT_SCORE
    fft: str = "shift"
    eps: float = 1e-6

    kind = "SelectiveCLS"
    stage = POOLING

    def __post_init__(self):
        self.k = int(self.k)
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.sigma is not None and not self.sigma > 0:
            raise ValueError(f"sigma must be > 0 (or None for sqrt(d)), got {self.sigma}")
        check_choice("score", self.score, list(SCORES))
        check_choice("fft", self.fft, FFT_VARIANTS)
        self.eps = float(self.eps)

    def pool_module(self, skip: int = 0) -> SelectivePool:
        return SelectivePool(self.k, self.sigma, self.score, self.fft, self.eps, skip=skip)

    def params(self) -> Dict[str, Any]:
        return {"k": self.k, "sigma": self.sigma, "score": self.score, "fft": self.fft, "eps": self.eps}
