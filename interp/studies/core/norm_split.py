"""Is there a separate high-norm mode? A two-component Gaussian mixture on log norms (pure numpy).

Normal patch-token norms of real ViTs are roughly log-normal (log-sigma ~0.15-0.45) and artifacts are a
small minority (1-5 %) several times the median. On log norms that is a wide Gaussian bulk plus a small
upper Gaussian, so :func:`split_norms` fits a two-component mixture by EM and accepts the split only when
all of these hold (each one's failure is named in ``reason``):

* **model selection**: BIC prefers two components over one by at least ``MIN_BIC_GAIN``;
* **minority**: the upper component holds at most ``MAX_UPPER_WEIGHT`` of the tokens (and at least
  ``MIN_UPPER_TOKENS`` of them);
* **separation**: Ashman's D = sqrt(2) |mu_2 - mu_1| / sqrt(s_1^2 + s_2^2) >= ``MIN_SEPARATION`` (two modes
  that overlap, or a heavy tail modelled by a wide second Gaussian over the same centre, have a small D);
* **ratio**: the upper mode's typical norm is at least ``MIN_MODE_RATIO`` times the bulk's.

A mixture was chosen over a density-valley rule because a 1 % mode sitting on the tail of a wide bulk
(log-sigma 0.45, 3x) shows as a shoulder, not a valley, while the mixture still resolves it; BIC (on all
tokens) keeps one Gaussian for a single log-normal, and D rejects heavy-tailed bulks (log-t, long right
tails), which BIC alone would not.

The cut (:func:`_cut`) is the norm that maximises the F1 score of the upper component under the fitted mixture,
except when the bulk is degenerate: its fitted log-sigma below ``MIN_BULK_SIGMA`` (norms equal to within about
2 %, which no trained ViT shows: their bulks have log-sigma 0.15-0.45, but a constructed model can; in the
bundled ``planted_vit`` every ordinary token has norm 141.5 and the bulk sits at EM's sigma floor). Such a
bulk's Gaussian tail ends a fraction of a percent above it, so the mixture calls every token just above the
bulk "upper" and the F1 cut lands on the bulk's edge (142 on ``planted_vit``: the ~3 % of partly activated
tokens between the modes counted as outliers, 21 % flagged for 18 % planted). The cut is then the middle of
the gap in norm: half-way between the bulk's norm and the median norm of the tokens above the F1 cut (not
the upper Gaussian's mean, which those in-between tokens pull down: 476 against 571 on ``planted_vit``).
Rules tried on ``planted_vit`` and on the realistic battery (``tests/test_detection_realistic.py``): a
valley of a kernel density between the modes cuts below seven ordinary tokens at 291-330 (precision 0.947,
the in-between tokens are sparsest at 200-290); the posterior-equal point of the fitted components sits on
the bulk's edge like the F1 cut (the bulk's density is degenerate); the middle of the gap on log norms gives
0.947-0.954; the middle in norm applied to every fit cuts into wide upper modes over tight bulks (recall
0.91 at log-sigma 0.15, 3x, upper log-sigma 0.3). Only the degenerate-bulk rule keeps the battery unchanged
(it never applies there) and puts ``planted_vit``'s cut between its modes (precision 1.0, recall 0.98).

Deterministic: EM starts from fixed quantile-based initialisations (no random numbers) and runs on at most
``MAX_FIT_POINTS`` evenly spaced order statistics of the log norms (a deterministic subsample that keeps the
distribution's shape); the log-likelihoods for BIC are evaluated on every token.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> norms = np.concatenate([rng.lognormal(3.0, 0.1, 980), rng.lognormal(5.0, 0.1, 20)])   # 2 % high-norm
>>> s = split_norms(norms)          # norms: any-shape array of positive norms
>>> bool(s.accepted), 20 < s.threshold < 150, round(s.share_above, 2)
(True, True, 0.02)
>>> bool(split_norms(rng.lognormal(3.0, 0.1, 1000)).accepted)              # one mode: no artifacts
False
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple

import numpy as np

# The upper mode must be a minority (fewer than half the tokens): artifacts are 1-5 % in real ViTs (2.4 % in
# DINOv2 ViT-g); the bundled planted_vit marks the flat patches, up to ~40 % of a photo with sky or background.
MAX_UPPER_WEIGHT = 0.5
MIN_UPPER_TOKENS = 3
MIN_SEPARATION = 2.0
MIN_MODE_RATIO = 2.0
MIN_BIC_GAIN = 10.0
# A bulk narrower than this (log-sigma; norms equal within ~2 %) is degenerate: its Gaussian tail says nothing
# about the tokens just above it, so the cut is the middle of the gap in norm instead of the F1-optimal cut.
MIN_BULK_SIGMA = 0.02
MIN_TOKENS = 20
MAX_FIT_POINTS = 20_000
# Upper-component shares the EM starts from (each init: the top share of the tokens vs the rest).
INIT_SHARES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
_MAX_ITER = 200
_TOL = 1e-8
_LOG_2PI = math.log(2 * math.pi)
_CHUNK = 1 << 16


@dataclass(frozen=True)
class Mode:
    """One Gaussian component on log norms: mean and sigma of log(norm), share of the tokens."""

    mean: float
    sigma: float
    weight: float

    @property
    def median_norm(self) -> float:
        """The component's typical norm, exp(mean)."""
        return float(math.exp(self.mean))


@dataclass(frozen=True)
class NormSplit:
    """The two-mode test on one set of norms.

    Attributes:
        n_tokens: norms tested; n_fitted: order statistics EM ran on (<= ``MAX_FIT_POINTS``).
        lower, upper: the fitted bulk and upper components (None when too few or identical norms).
        separation: Ashman's D between them (0 without a fit).
        mode_ratio: exp(upper.mean - lower.mean), the upper mode's norm over the bulk's.
        bic_one, bic_two: BIC of one and of two Gaussians on all log norms (lower is better; None without a fit).
        accepted: whether a separated minority high-norm mode exists (all tests passed).
        reason: why it was accepted or rejected (one sentence, numbers included).
        threshold: the cut between the modes (a norm) when accepted, else inf.
        share_above: share of the tokens above ``threshold`` (0 when rejected).
        expected_precision, expected_recall: of the upper component at ``threshold``, under the fitted mixture.
        cut_rule: how ``threshold`` was placed: "f1" (maximises the upper component's expected F1) or
            "gap_middle" (degenerate bulk: half-way in norm between the bulk and the tokens above the F1 cut);
            None when rejected.
    """

    n_tokens: int
    n_fitted: int
    lower: Optional[Mode]
    upper: Optional[Mode]
    separation: float
    mode_ratio: float
    bic_one: Optional[float]
    bic_two: Optional[float]
    accepted: bool
    reason: str
    threshold: float
    share_above: float
    expected_precision: Optional[float] = None
    expected_recall: Optional[float] = None
    cut_rule: Optional[str] = None

    def to_dict(self) -> Dict:
        """JSON-ready fields (inf threshold as None); modes with their median norms."""
        out = asdict(self)
        for key in ("lower", "upper"):
            mode = getattr(self, key)
            if mode is not None:
                out[key]["median_norm"] = mode.median_norm
        out["threshold"] = self.threshold if math.isfinite(self.threshold) else None
        return out

    def describe(self) -> str:
        """The fitted modes and the separation in words: 'modes at 48.1 (97.4 %) and 289 (2.6 %), x6.01, D 9.3'."""
        if self.lower is None or self.upper is None:
            return "no two-mode fit"
        return (f"modes at {self.lower.median_norm:.4g} ({100 * self.lower.weight:.1f} %) and "
                f"{self.upper.median_norm:.4g} ({100 * self.upper.weight:.1f} %), ratio {self.mode_ratio:.2f}, "
                f"separation D {self.separation:.2f}")


def _log_norms(norms: np.ndarray) -> np.ndarray:
    """Sorted log norms (float64, finite values only)."""
    x = np.asarray(norms, dtype=np.float64).ravel()
    x = np.log(np.clip(x[np.isfinite(x)], 1e-30, None))
    x.sort()
    return x


def _fit_points(x_sorted: np.ndarray) -> np.ndarray:
    """At most MAX_FIT_POINTS evenly spaced order statistics (first and last included)."""
    n = x_sorted.size
    if n <= MAX_FIT_POINTS:
        return x_sorted
    return x_sorted[np.linspace(0, n - 1, MAX_FIT_POINTS).round().astype(np.int64)]


def _component_logpdf(x: np.ndarray, mean: float, sigma: float) -> np.ndarray:
    return -0.5 * ((x - mean) / sigma) ** 2 - math.log(sigma) - 0.5 * _LOG_2PI


def _mixture_loglik(x: np.ndarray, params: np.ndarray) -> float:
    """Total log-likelihood of x under the mixture params (rows: weight, mean, sigma; one or two rows),
    evaluated in chunks so memory stays bounded on millions of norms."""
    total = 0.0
    for start in range(0, x.size, _CHUNK):
        part = x[start:start + _CHUNK]
        a = np.stack([math.log(w) + _component_logpdf(part, m, s) for w, m, s in params])
        top = a.max(0)
        total += float((top + np.log(np.exp(a - top).sum(0))).sum())
    return total


def _em(x: np.ndarray, params: np.ndarray, floor: float) -> Tuple[np.ndarray, float]:
    """EM from ``params`` ([2, 3]: weight, mean, sigma per component) to convergence; (params, loglik)."""
    (w0, m0, s0), (w1, m1, s1) = params
    last = -np.inf
    for _ in range(_MAX_ITER):
        # log of w_k N(x; m_k, s_k) up to the shared -log(2 pi)/2, then the upper component's responsibility
        l0 = (math.log(w0) - math.log(s0)) - 0.5 * ((x - m0) / s0) ** 2
        l1 = (math.log(w1) - math.log(s1)) - 0.5 * ((x - m1) / s1) ** 2
        top = np.maximum(l0, l1)
        e0, e1 = np.exp(l0 - top), np.exp(l1 - top)
        total = e0 + e1
        loglik = float((top + np.log(total)).sum()) - 0.5 * _LOG_2PI * x.size
        r1 = e1 / total
        n1 = float(r1.sum())
        n0 = x.size - n1
        if min(n0, n1) < 1e-9:
            break
        m1 = float(r1 @ x) / n1
        m0 = (float(x.sum()) - m1 * n1) / n0
        s1 = max(math.sqrt(float(r1 @ (x - m1) ** 2) / n1), floor)
        s0 = max(math.sqrt(float((1 - r1) @ (x - m0) ** 2) / n0), floor)
        w0, w1 = n0 / x.size, n1 / x.size
        if loglik - last < _TOL * x.size:
            break
        last = loglik
    params = np.array([[w0, m0, s0], [w1, m1, s1]])
    return params, _mixture_loglik(x, params)


def _initial(x_sorted: np.ndarray, share: float, floor: float) -> Optional[np.ndarray]:
    k = max(int(round(share * x_sorted.size)), 2)
    if k >= x_sorted.size - 2:
        return None
    lo, hi = x_sorted[:-k], x_sorted[-k:]
    return np.array([[1 - k / x_sorted.size, lo.mean(), max(lo.std(), floor)],
                     [k / x_sorted.size, hi.mean(), max(hi.std(), floor)]])


def _normal_sf(z: np.ndarray) -> np.ndarray:
    return np.array([0.5 * math.erfc(v / math.sqrt(2)) for v in z])


def _expected(lower: Mode, upper: Mode, cuts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(true, false positive shares) of the upper component above each log cut, under the fitted mixture."""
    tp = upper.weight * _normal_sf((cuts - upper.mean) / upper.sigma)
    fp = lower.weight * _normal_sf((cuts - lower.mean) / lower.sigma)
    return tp, fp


def _best_cut(lower: Mode, upper: Mode) -> float:
    """The log cut between the modes maximising the upper component's expected F1 under the fitted mixture."""
    grid = np.linspace(lower.mean, upper.mean + 3 * upper.sigma, 2001)
    tp, fp = _expected(lower, upper, grid)
    return float(grid[int(np.argmax(2 * tp / np.maximum(tp + fp + upper.weight, 1e-300)))])


def _cut(x_sorted: np.ndarray, lower: Mode, upper: Mode) -> Tuple[float, str, float, float]:
    """(log cut, rule, expected precision, expected recall) on sorted log norms ``x_sorted`` [n].

    The F1-optimal cut (rule "f1"), or, for a degenerate bulk (log-sigma < ``MIN_BULK_SIGMA``), the middle of
    the gap in norm (rule "gap_middle"): half-way between exp(lower.mean) and the median norm of the tokens
    above the F1 cut (never below the F1 cut). The module docstring says why.
    """
    cut, rule = _best_cut(lower, upper), "f1"
    if lower.sigma < MIN_BULK_SIGMA:
        above = x_sorted[np.searchsorted(x_sorted, cut, side="right"):]
        if above.size:
            middle = math.log(0.5 * (math.exp(lower.mean) + math.exp(float(np.median(above)))))
            cut, rule = max(cut, middle), "gap_middle"
    tp, fp = (float(v[0]) for v in _expected(lower, upper, np.array([cut])))
    return cut, rule, tp / max(tp + fp, 1e-300), tp / upper.weight


def _rejected(n: int, n_fit: int, reason: str, lower=None, upper=None, d=0.0, ratio=1.0, bic1=None,
              bic2=None) -> NormSplit:
    return NormSplit(n, n_fit, lower, upper, d, ratio, bic1, bic2, False, reason, math.inf, 0.0)


def split_norms(norms: np.ndarray) -> NormSplit:
    """Fit one and two Gaussians to log(norms) and test for a separated minority high-norm mode.

    Args:
        norms: positive norms, any shape (non-finite values are ignored).

    Returns:
        :class:`NormSplit` (``accepted``, ``threshold`` and ``reason`` say what was decided and why).
    """
    x_all = _log_norms(norms)
    n = int(x_all.size)
    if n < MIN_TOKENS:
        return _rejected(n, n, f"too few tokens ({n}) to test for a separate mode (at least {MIN_TOKENS})")
    spread = float(x_all.std())
    if spread < 1e-9:
        return _rejected(n, n, "all norms are equal: there is a single mode")
    x = _fit_points(x_all)
    floor = max(1e-3 * spread, 1e-6)
    fits = [_em(x, p, floor) for p in (_initial(x, s, floor) for s in INIT_SHARES) if p is not None]
    params, _ = max(fits, key=lambda f: f[1])
    params = params[np.argsort(params[:, 1])]  # lower mean first
    lower, upper = (Mode(float(m), float(s), float(w)) for w, m, s in params)
    d = math.sqrt(2) * (upper.mean - lower.mean) / math.sqrt(lower.sigma ** 2 + upper.sigma ** 2)
    ratio = math.exp(upper.mean - lower.mean)
    bic1 = -2 * _mixture_loglik(x_all, np.array([[1.0, x_all.mean(), spread]])) + 2 * math.log(n)
    bic2 = -2 * _mixture_loglik(x_all, params) + 5 * math.log(n)
    fitted = dict(lower=lower, upper=upper, d=d, ratio=ratio, bic1=bic1, bic2=bic2)
    failures = []
    if bic1 - bic2 < MIN_BIC_GAIN:
        failures.append(f"BIC prefers one mode (BIC 1 - BIC 2 = {bic1 - bic2:.1f} < {MIN_BIC_GAIN:g})")
    if upper.weight > MAX_UPPER_WEIGHT:
        failures.append(f"the upper mode holds {100 * upper.weight:.1f} % of the tokens (artifacts are a "
                        f"minority, at most {100 * MAX_UPPER_WEIGHT:g} %)")
    elif upper.weight * n < MIN_UPPER_TOKENS:
        failures.append(f"the upper mode holds {upper.weight * n:.1f} tokens (at least {MIN_UPPER_TOKENS})")
    if d < MIN_SEPARATION:
        failures.append(f"the modes are not separated (D {d:.2f} < {MIN_SEPARATION:g})")
    if ratio < MIN_MODE_RATIO:
        failures.append(f"the upper mode is only {ratio:.2f}x the bulk (at least {MIN_MODE_RATIO:g}x)")
    if failures:
        return _rejected(n, int(x.size), "; ".join(failures), **fitted)
    cut, rule, precision, recall = _cut(x_all, lower, upper)
    threshold = float(math.exp(cut))
    share = float(1 - np.searchsorted(x_all, cut, side="right") / n)
    reason = (f"BIC prefers two modes (BIC 1 - BIC 2 = {bic1 - bic2:.1f}), and the upper one is a minority, "
              f"separated (D >= {MIN_SEPARATION:g}) and at least {MIN_MODE_RATIO:g}x the bulk")
    if rule == "gap_middle":
        reason += (f"; the bulk is degenerate (log-sigma {lower.sigma:.2g} < {MIN_BULK_SIGMA:g}), so the cut is "
                   f"the middle of the gap in norm, {threshold:.4g}")
    return NormSplit(n, int(x.size), lower, upper, d, ratio, bic1, bic2, True, reason, threshold, share,
                     precision, recall, rule)
