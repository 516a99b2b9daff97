"""Selective aggregation ("LaSt", SCIENCE.md section 3): a global vector from the most stable patch per channel.

Pure functions on patch tokens, so studies can run them on cached tokens as well as on a live model:

>>> g, votes = selective_aggregate(patch_tokens, k=1)   # [b, n, d] -> [b, d], [b, n]

Steps, for X = patch tokens [b, n, d] (CLS excluded, final norm applied):

1. X_low = real(iFFT(FFT(X) * window)) along the channel axis d, with a Gaussian low-pass window
   (``sigma`` = sqrt(d) by default). ``fft="shift"`` follows the reference code: full complex FFT,
   ``fftshift``, multiply by the length-d symmetric Gaussian window centred at (d - 1) / 2 (as
   ``scipy.signal.windows.gaussian``; for even d this is half a bin off the zero frequency, which sits at
   d // 2), ``ifftshift``, inverse FFT, real part (computed exactly through an rfft, see
   :func:`shift_window_as_rfft`). ``fft="rfft"`` is the symmetric variant: ``rfft``,
   weights exp(-f^2 / (2 sigma^2)) at frequency f = 0..d//2, ``irfft``.
2. Stability score per patch and channel: ``paper`` X_low / (|X_low - X| + eps); ``code`` X / |X_low - X|
   (no eps, as the reference code); ``contrib`` X_low / (X_low - X + eps).
3. Per channel, the k patches of highest score; g[:, c] = mean of the ORIGINAL X over them. The vote
   count of a patch is the number of channels that selected it (votes sum to d * k per image).

The scores are computed in float32 (``torch.fft`` has no bfloat16); g keeps the dtype of X and is
differentiable through the gathered values (the selection itself is not).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

SCORES = ("paper", "code", "contrib")
FFT_VARIANTS = ("shift", "rfft")


def default_sigma(d: int) -> float:
    return math.sqrt(d)


def shift_window(d: int, sigma: float, device=None) -> torch.Tensor:
    """Length-d symmetric Gaussian window centred at (d - 1) / 2, in fftshift order. -> [d] float32."""
    j = torch.arange(d, dtype=torch.float64, device=device)
    return torch.exp(-((j - (d - 1) / 2.0) ** 2) / (2.0 * sigma ** 2)).float()


def rfft_window(d: int, sigma: float, device=None) -> torch.Tensor:
    """Gaussian weights at the rfft frequencies f = 0..d//2. -> [d // 2 + 1] float32."""
    f = torch.arange(d // 2 + 1, dtype=torch.float64, device=device)
    return torch.exp(-(f ** 2) / (2.0 * sigma ** 2)).float()


def shift_window_as_rfft(d: int, sigma: float, device=None) -> torch.Tensor:
    """The ``shift`` variant's window folded onto the rfft frequencies. -> [d // 2 + 1] float32.

    For real x, real(iFFT(FFT(x) * w)) = irfft(rfft(x) * (w[f] + w[-f]) / 2) with w in unshifted
    (frequency) order, because the spectrum of a real vector is Hermitian. So the reference's full
    complex FFT with fftshift is computed exactly (up to rounding) at the cost of an rfft.
    """
    w = torch.fft.ifftshift(shift_window(d, sigma, device))  # frequency order: w[f], f = 0..d-1
    f = torch.arange(d // 2 + 1, device=device)
    return (w[f] + w[(-f) % d]) / 2


def low_pass(x: torch.Tensor, sigma: Optional[float] = None, fft: str = "shift") -> torch.Tensor:
    """Gaussian low-pass of every vector along the last axis. x [..., d] -> X_low [..., d] float32."""
    d = x.shape[-1]
    sigma = default_sigma(d) if sigma is None else float(sigma)
    if fft == "shift":
        window = shift_window_as_rfft(d, sigma, x.device)
    elif fft == "rfft":
        window = rfft_window(d, sigma, x.device)
    else:
        raise ValueError(f"fft={fft!r} is not one of {list(FFT_VARIANTS)}")
    return torch.fft.irfft(torch.fft.rfft(x.float(), dim=-1) * window, n=d, dim=-1)


def stability_score(x: torch.Tensor, x_low: torch.Tensor, score: str = "paper", eps: float = 1e-6) -> torch.Tensor:
    """Per patch and channel stability score [..., d] (float32) for one of the three published formulas."""
    xf = x.float()
    if score == "paper":
        return x_low / ((x_low - xf).abs() + eps)
    if score == "code":
        return xf / (x_low - xf).abs()
    if score == "contrib":
        return x_low / (x_low - xf + eps)
    raise ValueError(f"score={score!r} is not one of {list(SCORES)}")


def selective_aggregate(
    x: torch.Tensor,
    k: int = 1,
    sigma: Optional[float] = None,
    score: str = "paper",
    fft: str = "shift",
    eps: float = 1e-6,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Selective aggregation of patch tokens.

    Args:
        x: patch tokens [b, n, d] (no CLS / registers).
        k: patches kept per channel, 1 <= k <= n; ``k = n`` equals average pooling.
        sigma: width of the Gaussian low-pass window in frequency bins (None = sqrt(d)).
        score: ``paper``, ``code`` or ``contrib`` (module docstring).
        fft: ``shift`` (reference) or ``rfft`` (symmetric variant).
        eps: the epsilon of the ``paper`` and ``contrib`` scores.

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
        # [b, k, d]; argmax is the k = 1 case of topk, and faster.
        top = scores.argmax(dim=1, keepdim=True) if k == 1 else scores.topk(int(k), dim=1).indices
    g = x.gather(1, top).mean(dim=1)
    votes = torch.zeros(b, n, dtype=torch.float32, device=x.device)
    votes.scatter_add_(1, top.reshape(b, -1), torch.ones(b, int(k) * d, dtype=torch.float32, device=x.device))
    return g, votes
