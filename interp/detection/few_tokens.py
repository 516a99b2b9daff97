"""A high-norm mode of a handful of tokens, judged by how unlikely its tokens are under the bulk.

BIC cannot prefer a component for three points among thousands by a wide margin: three tokens at 4.4-5.9x over
a bulk of log-sigma 0.30 (four images of 1369 patches, the bulk's own tail at 2.7x) gain only 4-8 in BIC, under
the split's margin of 10, and when the fit does accept such a mode its upper Gaussian takes in a few of the bulk's
tail tokens as well (one seed: 3 artifacts and 4 tail tokens above the cut, F1 0.6). So when the fitted upper mode
holds at most :data:`FEW_TOKENS` tokens and BIC is the only test it fails, or it passes every test
(:func:`~interp.detection.norm_split.split_norms`), the verdict and the count above the cut are decided here: for
each k from ``MIN_UPPER_TOKENS`` to :data:`FEW_TOKENS`, the chance that k or more of the n tokens lie at or above
the k-th largest norm if all were bulk tokens (a Poisson tail with mean n x the upper tail there of a Gaussian bulk
with the median and interquartile range of the log norms), times the number of k tried (Bonferroni). The k with the
smallest chance wins when that chance is below :data:`MAX_CHANCE`; the cut is then half-way (in log norm) between
the k-th and the (k+1)-th largest norms. For the k largest tokens of a bulk that is one log-normal the chance is
about 0.15-0.7 before the factor, so a bulk without artifacts is not split.

>>> import numpy as np
>>> x = np.sort(np.log(np.concatenate([np.exp(0.3 * np.random.default_rng(0).standard_normal(1000)), [5., 5.5, 6.]])))
>>> k, chance, cut, mean, sigma = few_tokens(x)
>>> k, chance < MAX_CHANCE, 3.0 < float(np.exp(cut)) < 5.0
(3, True, True)
>>> few_tokens(x[:-3]) is None                                        # the bulk alone
True
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np

# An upper mode of at most this many tokens (its fitted weight x n) is judged by this module, not by BIC.
FEW_TOKENS = 30
# The chance (Bonferroni over the k tried, so at most about this share of log-normal bulks is split) below which
# the k largest tokens are a mode of their own. Measured: one log-normal image of 576 patches, its best k 0.15-0.7
# before the factor of 28 (1 after it), seeds 0-9; three tokens at 3-4.6x over log-sigma 0.30 in one image of 576
# patches 1e-8 to 3e-5; at 4-6x among four images of 1369 patches 5e-10 to 2e-7 (seeds 0-4).
MAX_CHANCE = 1e-2
MIN_TOKENS = 3  # as the split's MIN_UPPER_TOKENS
MIN_MODE_RATIO = 2.0  # as the split's
# The tokens just below the k largest must be an ordinary bulk tail (each of their chances at least this): a
# log-t bulk's (df 3-5) tail lies beyond a Gaussian's all along, not only at its k largest tokens.
MIN_TAIL_CHANCE = 1e-3


def _poisson_tail(lam: float, k: int) -> float:
    """P(Poisson(lam) >= k), summed from k up (no cancellation for small lam)."""
    if lam <= 0.0:
        return 0.0
    term = math.exp(-lam + k * math.log(lam) - math.lgamma(k + 1))
    total, j = 0.0, k
    while term > 1e-300 and j < k + 200:
        total += term
        j += 1
        term *= lam / j
    return min(total, 1.0)


def _chances(x_sorted: np.ndarray, n: int, mean: float, sigma: float, ks) -> List[float]:
    """For each k of ``ks``: P(k or more of n bulk tokens lie at or above the k-th largest of ``x_sorted``)."""
    return [_poisson_tail(n * 0.5 * math.erfc((float(x_sorted[-k]) - mean) / sigma / math.sqrt(2)), k) for k in ks]


def few_tokens(x_sorted: np.ndarray) -> Optional[Tuple[int, float, float, float, float]]:
    """The k largest of the sorted log norms ``x_sorted`` [n] as a mode of their own (module docstring):
    (k, chance, log cut, bulk mean, bulk sigma), or None when no k passes.

    The bulk is the median and the interquartile range / 1.349 of the log norms (a handful of tokens moves
    neither). A k passes when its Bonferroni chance is below :data:`MAX_CHANCE`, its k-th largest token is at
    least ``MIN_MODE_RATIO`` times the median norm, and the tokens below it look like the bulk's own tail: for
    each j up to :data:`FEW_TOKENS`, j or more bulk tokens at or above the (k + j)-th largest has a chance of at
    least :data:`MIN_TAIL_CHANCE` (a heavy-tailed bulk, log-t, fails this: its tail is too far out all along)."""
    n = x_sorted.size
    if n < 4 * FEW_TOKENS:
        return None
    mean = float(np.median(x_sorted))
    sigma = float(np.subtract(*np.percentile(x_sorted, [75, 25]))) / 1.349
    if not sigma > 0:
        return None
    ks = range(MIN_TOKENS, FEW_TOKENS + 1)
    chances = _chances(x_sorted, n, mean, sigma, ks)
    k = ks[int(np.argmin(chances))]
    chance = min(chances[k - MIN_TOKENS] * len(ks), 1.0)
    if chance >= MAX_CHANCE or math.exp(float(x_sorted[-k]) - mean) < MIN_MODE_RATIO:
        return None
    if min(_chances(x_sorted[:-k], n - k, mean, sigma, range(1, FEW_TOKENS + 1))) < MIN_TAIL_CHANCE:
        return None
    return k, chance, 0.5 * float(x_sorted[-k] + x_sorted[-k - 1]), mean, sigma
