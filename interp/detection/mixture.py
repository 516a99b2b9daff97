"""Gaussian mixtures on one-dimensional data by EM (pure numpy, deterministic): what
:mod:`interp.detection.norm_split` fits to log norms.

A mixture is an array ``params`` [K, 3] whose rows are (weight, mean, sigma) of one component.

>>> import numpy as np
>>> x = np.sort(np.concatenate([np.linspace(-1, 1, 900), np.linspace(4, 5, 100)]))
>>> params, loglik = best_fit(x, 2, floor=1e-3)
>>> np.round(params[:, :2], 2).tolist()          # lower mean first
[[0.9, 0.0], [0.1, 4.5]]

The starts of one fit run together (:func:`_run`): each E-step evaluates every start still running in one
batch of numpy calls, while each start takes exactly the steps it would take alone (:func:`em`).
"""
from __future__ import annotations

import math
from typing import Generator, List, Optional, Sequence, Tuple

import numpy as np

# Upper-component shares the EM starts from (each init: the top share of the tokens vs the rest).
INIT_SHARES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
_MAX_ITER = 200
_TOL = 1e-8
_LOG_2PI = math.log(2 * math.pi)
_CHUNK = 1 << 16
_SQRT2 = math.sqrt(2.0)
# Terms exp(a - max a) below exp(-708) ~ 3e-308 are taken as 0 without computing them: such an exp is subnormal
# (or 0), which costs about four times as much as another, and changes no sum.
_EXP_MIN = -708.0
# Column totals (each in [1, K]) are multiplied this many at a time before their log: finite for K < 60 000.
_LOG_BLOCK = 64


class _Buffers:
    """Work arrays for the EM steps of up to ``n_mix`` mixtures of ``k`` components on x, in chunks of up to
    ``chunk`` values (all of x when it is shorter than :data:`_CHUNK` / n_mix, so that memory stays bounded on
    millions of values), allocated once per fit and overwritten by every step.

    Attributes:
        zq [n_mix, k, 3, chunk]: per mixture and component the rows 1, z and z^2 with z = (x - m) / scale,
            scale = sqrt(2) sigma: what the responsibilities are summed against.
        a [n_mix, k, chunk]: log terms; e [n_mix, k, chunk]: their exponentials, then the responsibilities;
        less [n_mix, k, chunk]: a mask.
        total [n_mix, width]: the column totals of e, padded with ones to a multiple of ``_LOG_BLOCK``.
        mid, half: the middle and half the width of x's range.
    """

    def __init__(self, n_mix: int, k: int, x: np.ndarray):
        self.chunk = max(1, min(x.size, _CHUNK // n_mix))
        self.zq = np.empty((n_mix, k, 3, self.chunk))
        self.zq[:, :, 0] = 1.0
        self.a = np.empty((n_mix, k, self.chunk))
        self.e = np.empty((n_mix, k, self.chunk))
        self.less = np.empty((n_mix, k, self.chunk), dtype=bool)
        self.total = np.ones((n_mix, -(-self.chunk // _LOG_BLOCK) * _LOG_BLOCK))
        lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
        self.mid, self.half = 0.5 * (lo + hi), 0.5 * (hi - lo)

    def views(self, n_mix: int, c: int):
        """(zq, a, e, less, total) for the first ``n_mix`` mixtures and ``c`` values (total keeps its width)."""
        if c < self.chunk:
            self.total[:n_mix, c:] = 1.0
        return (self.zq[:n_mix, :, :, :c], self.a[:n_mix, :, :c], self.e[:n_mix, :, :c], self.less[:n_mix, :, :c],
                self.total[:n_mix])

    def may_underflow(self, m: np.ndarray, scale: np.ndarray, base: np.ndarray) -> bool:
        """Whether a term a - max_k a may fall below ``_EXP_MIN`` on x for the mixtures (m, scale, base) [S, K]
        (a bound: a_k >= base_k - z_k^2 at the end of x farthest from m_k, and max_k a <= max_k base_k)."""
        z = (np.abs(m - self.mid) + self.half) / scale
        return bool((base.max(1, keepdims=True) - base + z * z).max() > -_EXP_MIN)


def _exp_terms(part: np.ndarray, m: np.ndarray, scale: np.ndarray, base: np.ndarray, skip_far: bool,
               zq: np.ndarray, a: np.ndarray, e: np.ndarray, less: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The terms of S mixtures on the values ``part`` [c], written in place: z = (x - m) / scale and z^2 in
    zq [S, K, 3, c]; a = base - z^2 = log(w N(x; m, sigma)) + log(2 pi) / 2 (base = log w - log sigma and
    scale = sqrt(2) sigma: m, scale, base [S, K]); e = exp(a - max_k a) [S, K, c] and its column totals in
    total[:, :c]. Returns the sum over the values of log sum_k exp(a), [S].

    Each column's largest term is exp(0) = 1, so only the others are exponentiated: an exp costs as much as
    twenty additions, and on sorted x the largest component changes a few times along the data, so the masked
    exp runs over a few long stretches. With ``skip_far`` (only where :meth:`_Buffers.may_underflow`), terms
    below exp(_EXP_MIN) are set to 0 without an exp. Sums over the K components go row by row: faster than a
    reduction over the short middle axis.
    """
    z, q = zq[:, :, 1], zq[:, :, 2]
    np.subtract(part, m[..., None], out=z)
    z *= (1.0 / scale)[..., None]
    np.square(z, out=q)
    np.subtract(base[..., None], q, out=a)
    k, c = a.shape[1], part.size
    top = np.maximum(a[:, 0], a[:, 1]) if k > 1 else a[:, 0].copy()  # [S, c]
    for j in range(2, k):
        np.maximum(top, a[:, j], out=top)
    a -= top[:, None]
    np.less(a, 0.0, out=less)
    e.fill(1.0)
    if skip_far:
        far = a < _EXP_MIN
        np.copyto(e, 0.0, where=far)
        np.copyto(less, False, where=far)
    np.exp(a, out=e, where=less)
    column = total[:, :c]
    if k > 1:
        np.add(e[:, 0], e[:, 1], out=column)
    else:
        np.copyto(column, e[:, 0])
    for j in range(2, k):
        column += e[:, j]
    # the sum of log(total) as the logs of products of _LOG_BLOCK totals: a log costs as much as an exp
    products = total.reshape(total.shape[0], _LOG_BLOCK, -1).prod(1)
    return top.sum(1) + np.log(products).sum(1)


def _chunk_terms(x: np.ndarray, params: np.ndarray, buffers: _Buffers):
    """For S mixtures ``params`` [S, K, 3], per chunk of x: (the sum of log sum_k w_k N(x; m_k, sigma_k) over
    the chunk plus log(2 pi) / 2 per value [S], zq, e, total [S, c]) as :func:`_exp_terms` leaves them."""
    m, s = params[..., 1], params[..., 2]
    scale, base = _SQRT2 * s, np.log(params[..., 0]) - np.log(s)
    skip_far = buffers.may_underflow(m, scale, base)
    for start in range(0, x.size, buffers.chunk):
        part = x[start:start + buffers.chunk]
        zq, a, e, less, total = buffers.views(params.shape[0], part.size)
        loglik = _exp_terms(part, m, scale, base, skip_far, zq, a, e, less, total)
        yield loglik, zq, e, total[:, :part.size]


def _logliks(x: np.ndarray, params: np.ndarray, buffers: _Buffers) -> np.ndarray:
    """Log-likelihoods [S] of x [n] under S mixtures ``params`` [S, K, 3]."""
    loglik = np.zeros(params.shape[0])
    for terms, *_ in _chunk_terms(x, params, buffers):
        loglik += terms
    return loglik - 0.5 * _LOG_2PI * x.size


def mixture_loglik(x: np.ndarray, params: np.ndarray) -> float:
    """Total log-likelihood of x under the mixture ``params`` [K, 3], evaluated in chunks so memory stays
    bounded on millions of values."""
    batch = np.asarray(params, dtype=np.float64)[None]
    return float(_logliks(x, batch, _Buffers(1, batch.shape[1], x))[0])


def _e_step(x: np.ndarray, params: np.ndarray, buffers: Optional[_Buffers] = None
            ) -> Tuple[np.ndarray, np.ndarray]:
    """E-step of S mixtures ``params`` [S, K, 3] on x [n] (one call, one E-step of each): (log-likelihoods
    [S], responsibility sums [S, K, 3]: sum r, sum r d, sum r d^2 with d = x - m_k, centred on each component's
    mean so that the variance keeps its digits). ``buffers`` are allocated when not given."""
    if buffers is None:
        buffers = _Buffers(params.shape[0], params.shape[1], x)
    loglik, sums = np.zeros(params.shape[0]), np.zeros(params.shape)
    for terms, zq, e, total in _chunk_terms(x, params, buffers):
        loglik += terms
        e *= (1.0 / total)[:, None]  # the responsibilities
        sums += np.matmul(zq, e[..., None])[..., 0]  # sum r, sum r z, sum r z^2
    scale = _SQRT2 * params[..., 2]  # d = scale z
    sums[..., 1] *= scale
    sums[..., 2] *= scale * scale
    return loglik - 0.5 * _LOG_2PI * x.size, sums


def _em_step(x: np.ndarray, params: np.ndarray, floor: float, buffers: Optional[_Buffers] = None
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One EM step from each of S mixtures ``params`` [S, K, 3]: (log-likelihoods of x at them [S], the next
    mixtures [S, K, 3], lost [S]: a component has lost all its weight, and that mixture has no next one)."""
    loglik, sums = _e_step(x, params, buffers)
    nk = sums[..., 0]
    lost = nk.min(1) < 1e-9
    after = np.empty_like(params)
    with np.errstate(divide="ignore", invalid="ignore"):  # the lost mixtures' rows are not used
        shift = sums[..., 1] / nk  # the new mean minus the old
        var = np.maximum(sums[..., 2] / nk - shift * shift, 0.0)  # E_r[(x - m_new)^2]
    after[..., 0] = nk / x.size
    after[..., 1] = params[..., 1] + shift
    after[..., 2] = np.maximum(np.sqrt(var), floor)
    return loglik, after, lost


def _extrapolate(start: np.ndarray, one: np.ndarray, two: np.ndarray, floor: float) -> Optional[np.ndarray]:
    """SQUAREM's step (Varadhan & Roland 2008, scheme S3) from ``start`` along its two EM steps ``one``,
    ``two`` (params [K, 3] each), in (log weight, mean, log sigma) coordinates; None where it is no longer than
    the plain two steps, or leaves the parameter space."""
    t0, t1, t2 = (np.concatenate([np.log(p[:, 0]), p[:, 1], np.log(p[:, 2])]) for p in (start, one, two))
    r, v = t1 - t0, t2 - 2 * t1 + t0
    vv = float(v @ v)
    if vv == 0.0:
        return None
    alpha = -math.sqrt(float(r @ r) / vv)
    if alpha >= -1.0:  # alpha = -1 is exactly the second step
        return None
    t = t0 - 2 * alpha * r + alpha * alpha * v
    k = start.shape[0]
    with np.errstate(over="ignore", under="ignore"):
        w = np.exp(t[:k] - t[:k].max())
        w /= w.sum()
        sigma = np.maximum(np.exp(t[2 * k:]), floor)
    if not (np.all(np.isfinite(t)) and w.min() > 0 and np.all(np.isfinite(sigma))):
        return None
    return np.stack([w, t[k:2 * k], sigma], axis=1)


def _squarem(n: int, params: np.ndarray, floor: float
             ) -> Generator[np.ndarray, Tuple[float, Optional[np.ndarray]], np.ndarray]:
    """One start's EM on n values (see :func:`em`) as a generator: it yields each mixture (params [K, 3]) it
    needs an EM step from, is sent back (the log-likelihood there, the next mixture or None when a component
    lost all its weight), and returns the final params [K, 3]."""
    state = params.astype(np.float64)
    steps, last = 0, -np.inf
    while steps < _MAX_ITER:
        loglik, one = yield state
        steps += 1
        if one is None:
            break
        if loglik - last < _TOL * n:
            state = one
            break
        last = loglik
        loglik_one, two = yield one
        steps += 1
        if two is None:
            state = one
            break
        jump = _extrapolate(state, one, two, floor)
        state = two
        if jump is not None and steps < _MAX_ITER:
            loglik_jump, beyond = yield jump
            steps += 1
            if beyond is not None and loglik_jump >= loglik_one:
                state = beyond
    return state.copy()  # not a view into a batch's arrays


def _run(x: np.ndarray, starts: Sequence[np.ndarray], floor: float) -> List[Tuple[np.ndarray, float]]:
    """:func:`em` from each of ``starts`` (params [K, 3], one K): [(params, loglik on x)], in their order.

    The starts run side by side: each round takes the mixture every unfinished start needs a step from and
    does those EM steps in one batch (one :func:`_em_step` on [S, K, 3]), so the numpy calls are shared while
    each start follows its own trajectory and stops when it alone has converged."""
    runs = [_squarem(x.size, p, floor) for p in starts]
    asked = {i: next(run) for i, run in enumerate(runs)}  # start -> the mixture it needs a step from
    buffers = _Buffers(len(runs), starts[0].shape[0], x)
    final: List[np.ndarray] = [np.empty(0)] * len(runs)
    while asked:
        ids = list(asked)
        loglik, after, lost = _em_step(x, np.stack([asked[i] for i in ids]), floor, buffers)
        for row, (i, value, gone) in enumerate(zip(ids, loglik.tolist(), lost.tolist())):
            try:
                asked[i] = runs[i].send((value, None if gone else after[row]))
            except StopIteration as stop:
                final[i] = stop.value
                del asked[i]
    return list(zip(final, _logliks(x, np.stack(final), buffers).tolist()))


def em(x: np.ndarray, params: np.ndarray, floor: float) -> Tuple[np.ndarray, float]:
    """EM from ``params`` [K, 3] to convergence (sigmas kept >= ``floor``); (params, loglik on x).

    Accelerated by SQUAREM: each cycle takes two EM steps, extrapolates along them and takes one more EM step
    from there; an extrapolation that lowers the likelihood below the first step's is dropped for the plain
    second step, so the likelihood never decreases, and the fixed points are EM's. At most ``_MAX_ITER``
    E-steps; converged when one cycle raises the log-likelihood by less than ``_TOL`` per value."""
    return _run(x, [params], floor)[0]


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
    (None, -inf) when the data are too few for any start. The starts run together (:func:`_run`)."""
    inits = [p for p in (_initial(x_sorted, s, floor) for s in starts(k)) if p is not None]
    if not inits:
        return None, -math.inf
    params, loglik = max(_run(x_sorted, inits, floor), key=lambda f: f[1])
    return params[np.argsort(params[:, 1])], loglik
