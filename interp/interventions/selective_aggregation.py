"""Selective aggregation ("LaSt", docs/methods.md section 3): a global vector from the most stable patch per channel.

Pure arithmetic on patch tokens, so studies run it on cached tokens as well as on a live model (the
intervention that puts it in front of a model's head is :class:`~interp.interventions.SelectiveCLS`):

>>> patch_tokens = torch.randn(2, 196, 64)
>>> g, votes = selective_aggregate(patch_tokens)            # [b, n, d] -> [b, d], [b, n]; the reference
>>> g.shape, votes.shape
(torch.Size([2, 64]), torch.Size([2, 196]))
>>> g, votes = selective_aggregate(patch_tokens, k=7, score="paper")
>>> torch.allclose(selective_aggregate(patch_tokens, k=196)[0], patch_tokens.mean(1), atol=1e-5)   # k = n: mean
True

Steps, for X = patch tokens [b, n, d] (CLS excluded, final norm applied):

1. X_low = Gaussian low-pass of every patch vector along the channel axis d (``sigma`` = sqrt(d) by default).
   ``fft="shift"`` is the reference code's arithmetic (``ChengShiest/LAST-ViT`` ``cls_pretrain/conf.py``,
   class ``dense_vit``): full complex FFT, ``fftshift``, multiply by
   ``exp(-0.5 * (arange(-d // 2 + 1, d // 2 + 1) / sigma) ** 2)`` max-normalised (Python's ``-d // 2`` is
   floor(-d / 2); for even d the peak sits at shifted index d // 2 - 1, one bin left of the zero frequency,
   so the window is not symmetric in frequency), ``ifftshift``, inverse FFT, real part.
   ``fft="rfft"`` is a symmetric variant: ``rfft``, weights exp(-f^2 / (2 sigma^2)) at f = 0..d//2, ``irfft``
   (differs from ``shift`` by ~4e-4..8e-4 relative in X_low and changes a few channels' selection).
2. Stability score per patch and channel (:data:`SCORES`), one of three published formulas:

   * ``code`` (default): X / |X_low - X|, no eps, as the reference code that trained the released LaSt
     checkpoints (``dense_vit.forward``);
   * ``paper``: X_low / (|X_low - X| + eps), the formula printed in the LaSt paper (CVPR 2026);
   * ``contrib``: X_low / (X_low - X + eps), a contributed script's variant.
3. Per channel, the k patches of highest score (``torch.topk`` over the patch axis, as the reference);
   g[:, c] = mean of the ORIGINAL X over them (k = 1 in the reference; k = n equals average pooling).
   The vote count of a patch is the number of channels that selected it (votes sum to d * k per image).

The scores are computed in float32 (``torch.fft`` has no bfloat16); g keeps the dtype of X and is
differentiable through the gathered values (the selection itself is not).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch

ScoreFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def _score_code(x: torch.Tensor, x_low: torch.Tensor, eps: float) -> torch.Tensor:
    return x / (x_low - x).abs()  # the reference code: no eps (eps unused)


def _score_paper(x: torch.Tensor, x_low: torch.Tensor, eps: float) -> torch.Tensor:
    return x_low / ((x_low - x).abs() + eps)


def _score_contrib(x: torch.Tensor, x_low: torch.Tensor, eps: float) -> torch.Tensor:
    return x_low / (x_low - x + eps)


#: Stability score formulas: name -> fn(x [..., d] float32, x_low [..., d] float32, eps) -> score [..., d].
SCORES: Dict[str, ScoreFn] = {"code": _score_code, "paper": _score_paper, "contrib": _score_contrib}
DEFAULT_SCORE = "code"
FFT_VARIANTS = ("shift", "rfft")


def default_sigma(d: int) -> float:
    """The reference code's window width: sqrt(d) frequency bins."""
    return math.sqrt(d)


def shift_window(d: int, sigma: float, device=None) -> torch.Tensor:
    """The reference Gaussian window in fftshift order, computed as the reference does (float32). -> [d].

    Values exp(-0.5 * (j / sigma)^2) for j = -d // 2 + 1 .. d // 2 (Python floor division), divided by their
    maximum; the peak (j = 0) sits at index d // 2 - 1 for even d and d // 2 for odd d.
    """
    j = torch.arange(-d // 2 + 1, d // 2 + 1, device=device).float()
    window = torch.exp(-0.5 * (j / sigma) ** 2)
    return window / torch.max(window)


def rfft_window(d: int, sigma: float, device=None) -> torch.Tensor:
    """Gaussian weights at the rfft frequencies f = 0..d//2 (the symmetric variant). -> [d // 2 + 1] float32."""
    f = torch.arange(d // 2 + 1, dtype=torch.float64, device=device)
    return torch.exp(-(f ** 2) / (2.0 * sigma ** 2)).float()


def low_pass(x: torch.Tensor, sigma: Optional[float] = None, fft: str = "shift") -> torch.Tensor:
    """Gaussian low-pass of every vector along the last axis. x [..., d] -> X_low [..., d] float32."""
    d = x.shape[-1]
    sigma = default_sigma(d) if sigma is None else float(sigma)
    xf = x.float()
    if fft == "shift":
        # ifftshift(fftshift(F) * w) == F * ifftshift(w) element for element (the shifts only permute), so this
        # is the reference's arithmetic bit for bit, without the two copies.
        window = torch.fft.ifftshift(shift_window(d, sigma, x.device))
        return torch.fft.ifft(torch.fft.fft(xf, dim=-1) * window, dim=-1).real
    if fft == "rfft":
        return torch.fft.irfft(torch.fft.rfft(xf, dim=-1) * rfft_window(d, sigma, x.device), n=d, dim=-1)
    raise ValueError(f"fft={fft!r} is not one of {list(FFT_VARIANTS)}")


def stability_score(x: torch.Tensor, x_low: torch.Tensor, score: str = DEFAULT_SCORE,
                    eps: float = 1e-6) -> torch.Tensor:
    """Per patch and channel stability score [..., d] (float32) by one of :data:`SCORES`."""
    fn = SCORES.get(score)
    if fn is None:
        raise ValueError(f"score={score!r} is not one of {list(SCORES)}")
    return fn(x.float(), x_low, eps)


def selective_aggregate(
    x: torch.Tensor,
    k: int = 1,
    sigma: Optional[float] = None,
    score: str = DEFAULT_SCORE,
    fft: str = "shift",
    eps: float = 1e-6,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Selective aggregation of patch tokens; the defaults are the reference code's (module docstring).

    Args:
        x: patch tokens [b, n, d] (no CLS / registers).
        k: patches kept per channel, 1 <= k <= n; ``k = n`` equals average pooling.
        sigma: width of the Gaussian low-pass window in frequency bins (None = sqrt(d)).
        score: ``code`` (reference code), ``paper`` or ``contrib`` (:data:`SCORES`).
        fft: ``shift`` (reference) or ``rfft`` (symmetric variant).
        eps: the epsilon of the ``paper`` and ``contrib`` scores (``code`` has none).

    Returns:
        g [b, d] (dtype of x), votes [b, n] float32: per patch, how many channels selected it.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be patch tokens [b, n, d], got shape {tuple(x.shape)}")
    b, n, d = x.shape
    if not 1 <= int(k) <= n:
        raise ValueError(f"k={k} must be in [1, {n}] (the number of patches)")
    with torch.no_grad():
        scores = stability_score(x, low_pass(x, sigma, fft), score, eps)
        top = scores.topk(int(k), dim=1).indices  # [b, k, d], as the reference (also for k = 1)
    g = x.gather(1, top).mean(dim=1)
    votes = torch.zeros(b, n, dtype=torch.float32, device=x.device)
    votes.scatter_add_(1, top.reshape(b, -1), torch.ones(b, int(k) * d, dtype=torch.float32, device=x.device))
    return g, votes
