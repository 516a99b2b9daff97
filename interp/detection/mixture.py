"""Gaussian mixtures on one-dimensional data by EM (pure numpy, deterministic): what
:mod:`interp.detection.norm_split` fits to log norms.

A mixture is an array ``params`` [K, 3] whose rows are (weight, mean, sigma) of one component.

>>> import numpy as np
>>> x = np.sort(np.concatenate([np.linspace(-1, 1, 900), np.linspace(4, 5, 100)]))
>>> params, loglik = best_fit(x, 2, floor=1e-3)
>>> np.round(params[:, :2], 2).tolist()          # lower mean first
[[0.9, 0.0], [0.1, 4.5]]
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np

# Upper-component shares the EM starts from (each init: the top share of the tokens vs the rest).
INIT_SHARES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
_MAX_ITER = 200
_TOL = 1e-8
_LOG_2PI = math.log(2 * math.pi)
_CHUNK = 1 << 16


def component_logpdf(x: np.ndarray, mean: float, sigma: float) -> np.ndarray:
    return -0.5 * ((x - mean) / sigma) ** 2 - math.log(sigma) - 0.5 * _LOG_2PI


def mixture_loglik(x: np.ndarray, params: np.ndarray) -> float:
    """Total log-likelihood of x under the mixture ``params`` [K, 3], evaluated in chunks so memory stays
    bounded on millions of values."""
    total = 0.0
    for start in range(0, x.size, _CHUNK):
        part = x[start:start + _CHUNK]
        a = np.stack([math.log(w) + component_logpdf(part, m, s) for w, m, s in params])
        top = a.max(0)
        total += float((top + np.log(np.exp(a - top).sum(0))).sum())
    return total


def _e_step(x: np.ndarray, w: np.ndarray, m: np.ndarray, s: np.ndarray) -> Tuple[float, np.ndarray]:
    """Log-likelihood of ``x`` and the responsibility sums [K, 3] (sum r, sum r d, sum r d^2 with d = x - m_k:
    centred on each component's mean, so the variance keeps its digits), in chunks of :data:`_CHUNK` values so
    that memory stays bounded on millions of norms."""
    loglik, sums = 0.0, np.zeros((w.size, 3))
    base = (np.log(w) - np.log(s))[:, None]
    for start in range(0, x.size, _CHUNK):
        d = x[None, start:start + _CHUNK] - m[:, None]  # [K, c]
        # log of w_k N(x; m_k, s_k) up to the shared -log(2 pi)/2, then the responsibilities
        r = np.square(d / s[:, None])
        np.multiply(r, -0.5, out=r)
        r += base
        top = r.max(0)
        r -= top
        np.exp(r, out=r)
        total = r.sum(0)
        loglik += float((top + np.log(total)).sum())
        r /= total
        sums[:, 0] += r.sum(1)
        sums[:, 1] += (r * d).sum(1)
        np.square(d, out=d)
        sums[:, 2] += (r * d).sum(1)
    return loglik - 0.5 * _LOG_2PI * x.size, sums


def _em_step(x: np.ndarray, w: np.ndarray, m: np.ndarray, s: np.ndarray, floor: float
             ) -> Tuple[float, Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """One EM step from the mixture (w, m, s), each [K]: (log-likelihood of x at it, the next (w, m, s)), the
    next None when a component has lost all its weight."""
    loglik, sums = _e_step(x, w, m, s)
    nk = sums[:, 0]
    if nk.min() < 1e-9:
        return loglik, None
    shift = sums[:, 1] / nk  # the new mean minus the old
    sigma = np.maximum(np.sqrt(np.maximum(sums[:, 2] / nk - shift * shift, 0.0)), floor)  # E_r[(x - m_new)^2]
    return loglik, (nk / x.size, m + shift, sigma)


def _extrapolate(start, one, two, floor: float) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """SQUAREM's step (Varadhan & Roland 2008, scheme S3) from ``start`` along its two EM steps ``one``,
    ``two``, in (log weight, mean, log sigma) coordinates; None where it is no longer than the plain two
    steps, or leaves the parameter space."""
    t0, t1, t2 = (np.concatenate([np.log(w), m, np.log(s)]) for w, m, s in (start, one, two))
    r, v = t1 - t0, t2 - 2 * t1 + t0
    vv = float(v @ v)
    if vv == 0.0:
        return None
    alpha = -math.sqrt(float(r @ r) / vv)
    if alpha >= -1.0:  # alpha = -1 is exactly the second step
        return None
    t = t0 - 2 * alpha * r + alpha * alpha * v
    k = start[0].size
    with np.errstate(over="ignore", under="ignore"):
        w = np.exp(t[:k] - t[:k].max())
        w /= w.sum()
        sigma = np.maximum(np.exp(t[2 * k:]), floor)
    if not (np.all(np.isfinite(t)) and w.min() > 0 and np.all(np.isfinite(sigma))):
        return None
    return w, t[k:2 * k], sigma


def em(x: np.ndarray, params: np.ndarray, floor: float) -> Tuple[np.ndarray, float]:
    """EM from ``params`` [K, 3] to convergence (sigmas kept >= ``floor``); (params, loglik on x).

    Accelerated by SQUAREM: each cycle takes two EM steps, extrapolates along them and takes one more EM step
    from there; an extrapolation that lowers the likelihood below the first step's is dropped for the plain
    second step, so the likelihood never decreases, and the fixed points are EM's. At most ``_MAX_ITER``
    E-steps; converged when one cycle raises the log-likelihood by less than ``_TOL`` per value."""
    state = tuple(params[:, i].astype(np.float64).copy() for i in range(3))
    steps, last = 0, -np.inf
    while steps < _MAX_ITER:
        loglik, one = _em_step(x, *state, floor)
        steps += 1
        if one is None:
            break
        if loglik - last < _TOL * x.size:
            state = one
            break
        last = loglik
        loglik_one, two = _em_step(x, *one, floor)
        steps += 1
        if two is None:
            state = one
            break
        jump = _extrapolate(state, one, two, floor)
        state = two
        if jump is not None and steps < _MAX_ITER:
            loglik_jump, beyond = _em_step(x, *jump, floor)
            steps += 1
            if beyond is not None and loglik_jump >= loglik_one:
                state = beyond
    out = np.stack(state, axis=1)
    return out, mixture_loglik(x, out)


def _initial(x_sorted: np.ndarray, shares: Tuple[float, ...], floor: float) -> Optional[np.ndarray]:
    """Components from consecutive slices of the sorted data: the top ``shares[-1]``, the next ``shares[-2]``,
    ..., the rest (lowest first); None when a slice would be too small."""
    n = x_sorted.size
    ends, end = [], n
    for share in reversed(shares):
        k = max(int(round(share * n)), 2)
        end -= k
        ends.append(end)
    if end < 3:
        return None
    bounds = [0] + ends[::-1] + [n]
    rows = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        part = x_sorted[lo:hi]
        rows.append([part.size / n, part.mean(), max(part.std(), floor)])
    return np.array(rows)


# (middle, top) shares of the three-component starts: a 3x mode of 1-5 % under an 8x mode of 0.5-2 %.
THREE_STARTS = ((0.01, 0.005), (0.02, 0.01), (0.05, 0.01), (0.1, 0.02))


def starts(k: int) -> List[Tuple[float, ...]]:
    """Fixed EM starts of a k-component fit (2 or 3): upper shares, top slice last."""
    return [(share,) for share in INIT_SHARES] if k == 2 else list(THREE_STARTS)


def best_fit(x_sorted: np.ndarray, k: int, floor: float) -> Tuple[Optional[np.ndarray], float]:
    """The k-component mixture of highest likelihood over the fixed starts, rows by increasing mean;
    (None, -inf) when the data are too few for any start."""
    fits = [em(x_sorted, p, floor) for p in (_initial(x_sorted, s, floor) for s in starts(k)) if p is not None]
    if not fits:
        return None, -math.inf
    params, loglik = max(fits, key=lambda f: f[1])
    return params[np.argsort(params[:, 1])], loglik
