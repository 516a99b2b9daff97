"""Is there a separate high-norm mode? A two-component Gaussian mixture on log norms (pure numpy).

Normal patch-token norms of real ViTs are roughly log-normal (log-sigma ~0.15-0.45) and artifacts are a
small minority (1-5 %) several times the median. On log norms that is a wide Gaussian bulk plus a small
upper Gaussian, so :func:`split_norms` fits a two-component mixture by EM and accepts the split only when
all of these hold (each one's failure is named in ``reason``):

* **model selection**: BIC prefers two components over one by at least ``MIN_BIC_GAIN``;
* **minority**: the upper component holds at most ``MAX_UPPER_WEIGHT`` of the tokens (and at least
  ``MIN_UPPER_TOKENS`` tokens lie above the cut);
* **separation**: Ashman's D = sqrt(2) |mu_2 - mu_1| / sqrt(s_1^2 + s_2^2) >= ``MIN_SEPARATION`` (two modes
  that overlap, or a heavy tail modelled by a wide second Gaussian over the same centre, have a small D);
* **ratio**: the upper mode's typical norm is at least ``MIN_MODE_RATIO`` times the bulk's.

Norms [N images, P patches] are first divided by each image's scale (its 10th-percentile norm over the median
image's, ``normalisation="per_image_p10"``), so images whose bulks differ in scale share one fit and each image
gets its own cut (:meth:`NormSplit.image_thresholds`); a three-component fit (bulk and two upper modes, e.g.
3x and 8x) replaces the two-component one when BIC prefers it by ``MIN_BIC_GAIN`` and it passes the same
tests. ``docs/methods.md`` section 1 gives the measurements behind both.

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
Rules tried on ``planted_vit`` and on the realistic battery (``tests/studies/core/test_detection_realistic.py``): a
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
import hashlib
from collections import OrderedDict
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .few_tokens import FEW_TOKENS, MAX_CHANCE, few_tokens
from .mixture import best_fit, mixture_loglik

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
BIC_FAILS = "BIC prefers"  # how the BIC test's failure starts (the only one a handful of tokens may overrule)
MAX_FIT_POINTS = 10_000
# Each image's scale for "per_image_p10": its 10th-percentile norm. The median would do for images whose
# artifacts are a few percent, but the bundled planted_vit puts 61 % of one photo's patches and up to 82 % of a
# zoomed crop's in the upper mode (their median, even their 25th percentile, is an artifact's norm); the 10th
# percentile stays in the bulk up to 90 % of artifacts, and on 196 log-normal norms it is about as precise as
# the median (standard error 0.12 vs 0.09 bulk log-sigmas).
SCALE_PERCENTILE = 10.0
NORMALISATIONS = ("per_image_p10", "none")
# The last splits of this process, by the norms' bytes: the studies of one run detect on the same baseline norms
# (norms, neurons, ablation and the report all split them), and a split is deterministic (0.03-0.4 s of EM on
# one thread).
_RECENT: "OrderedDict[Tuple[str, Tuple[int, ...], str], NormSplit]" = OrderedDict()
_RECENT_MAX = 16


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
        lower, upper: the fitted bulk and (nearest) upper component (None when too few or identical norms).
        separation: Ashman's D between them (0 without a fit).
        mode_ratio: exp(upper.mean - lower.mean), the upper mode's norm over the bulk's.
        bic_one, bic_two: BIC of one and of two Gaussians on all log norms (lower is better; None without a fit).
        accepted: whether a separated minority high-norm mode exists (all tests passed).
        reason: why it was accepted or rejected (one sentence, numbers included).
        threshold: the cut between the modes (a norm) when accepted, else inf. Under "per_image_p10" it is the
            cut of an image whose scale is the median image's: image i's own cut is ``threshold *
            image_scales[i]`` (:meth:`image_thresholds`).
        share_above: share of the tokens above their image's cut (0 when rejected).
        expected_precision, expected_recall: of the upper component(s) at the cut, under the fitted mixture.
        cut_rule: how ``threshold`` was placed: "f1" (maximises the upper component's expected F1) or
            "gap_middle" (degenerate bulk: half-way in norm between the bulk and the tokens above the F1 cut);
            None when rejected.
        normalisation: "per_image_p10" (each image's norms divided by its 10th percentile over the median
            image's, then one fit) or "none" (one fit on the pooled norms: a 1-D input).
        image_scales: per image, its 10th-percentile norm over the median image's ([N]; None for "none").
        more_upper: further upper components (a second artifact mode above ``upper``; empty for two modes).
        bic_three: BIC of three Gaussians (None without a fit); the three-mode fit is taken over the two-mode
            one when it gains at least ``MIN_BIC_GAIN`` and passes every test with its two upper components.
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
    normalisation: str = "none"
    image_scales: Optional[Tuple[float, ...]] = None
    more_upper: Tuple[Mode, ...] = ()
    bic_three: Optional[float] = None

    def image_thresholds(self, n_images: int = 1) -> np.ndarray:
        """Each image's cut in its own norms: [N] (``threshold`` times the image's scale); ``n_images``
        copies of ``threshold`` without per-image scales."""
        if self.image_scales is None:
            return np.full(n_images, self.threshold)
        return self.threshold * np.asarray(self.image_scales, dtype=np.float64)

    def to_dict(self) -> Dict:
        """JSON-ready fields (inf threshold as None); modes with their median norms."""
        out = asdict(self)
        for key in ("lower", "upper"):
            mode = getattr(self, key)
            if mode is not None:
                out[key]["median_norm"] = mode.median_norm
        for i, mode in enumerate(self.more_upper):
            out["more_upper"][i]["median_norm"] = mode.median_norm
        out["threshold"] = self.threshold if math.isfinite(self.threshold) else None
        out["image_scales"] = None if self.image_scales is None else list(self.image_scales)
        return out

    def describe(self) -> str:
        """The fitted modes and the separation in words: 'modes at 48.1 (97.4 %) and 289 (2.6 %), x6.01, D 9.3'."""
        if self.lower is None or self.upper is None:
            return "no two-mode fit"
        uppers = " and ".join(f"{m.median_norm:.4g} ({100 * m.weight:.1f} %)" for m in (self.upper, *self.more_upper))
        text = (f"modes at {self.lower.median_norm:.4g} ({100 * self.lower.weight:.1f} %) and {uppers}, ratio "
                f"{self.mode_ratio:.2f}, separation D {self.separation:.2f}")
        return text + ("; norms per image over its 10th percentile" if self.normalisation == "per_image_p10" else "")


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


def _normal_sf(z: np.ndarray) -> np.ndarray:
    return np.array([0.5 * math.erfc(v / math.sqrt(2)) for v in z])


def _expected(lower: Mode, uppers: Sequence[Mode], cuts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(true, false positive shares) of the upper component(s) above each log cut, under the fitted mixture."""
    tp = sum(u.weight * _normal_sf((cuts - u.mean) / u.sigma) for u in uppers)
    fp = lower.weight * _normal_sf((cuts - lower.mean) / lower.sigma)
    return tp, fp


def _best_cut(lower: Mode, upper: Mode, *more: Mode) -> float:
    """The log cut above the bulk maximising the upper components' expected F1 under the fitted mixture."""
    uppers = (upper, *more)
    grid = np.linspace(lower.mean, max(u.mean + 3 * u.sigma for u in uppers), 2001)
    tp, fp = _expected(lower, uppers, grid)
    weight = sum(u.weight for u in uppers)
    return float(grid[int(np.argmax(2 * tp / np.maximum(tp + fp + weight, 1e-300)))])


def _cut(x_sorted: np.ndarray, lower: Mode, uppers: Sequence[Mode]) -> Tuple[float, str, float, float]:
    """(log cut, rule, expected precision, expected recall) on sorted log norms ``x_sorted`` [n].

    The F1-optimal cut (rule "f1"), or, for a degenerate bulk (log-sigma < ``MIN_BULK_SIGMA``), the middle of
    the gap in norm (rule "gap_middle"): half-way between exp(lower.mean) and the median norm of the tokens
    above the F1 cut (never below the F1 cut). The module docstring says why.
    """
    cut, rule = _best_cut(lower, *uppers), "f1"
    if lower.sigma < MIN_BULK_SIGMA:
        above = x_sorted[np.searchsorted(x_sorted, cut, side="right"):]
        if above.size:
            middle = math.log(0.5 * (math.exp(lower.mean) + math.exp(float(np.median(above)))))
            cut, rule = max(cut, middle), "gap_middle"
    tp, fp = (float(v[0]) for v in _expected(lower, uppers, np.array([cut])))
    return cut, rule, tp / max(tp + fp, 1e-300), tp / sum(u.weight for u in uppers)


def _image_scales(norms: np.ndarray, normalisation: str) -> Optional[np.ndarray]:
    """Each image's scale over the median image's ([N]) for "per_image_p10" on norms [N, P]; None for "none"."""
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation {normalisation!r}: use one of {', '.join(NORMALISATIONS)}")
    if normalisation == "none":
        return None
    if norms.ndim != 2:
        raise ValueError(f"per-image normalisation needs norms [N images, P patches], got shape {norms.shape}")
    valid = np.isfinite(norms) & (norms > 0)
    if not norms.size:
        scale = np.ones(norms.shape[0])
    elif valid.all():  # the same values as nanpercentile, without its Python loop over the images
        scale = np.percentile(norms, SCALE_PERCENTILE, axis=1)
    else:
        scale = np.nanpercentile(np.where(valid, norms, np.nan), SCALE_PERCENTILE, axis=1)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, np.nan)
    typical = np.nanmedian(scale) if np.isfinite(scale).any() else 1.0
    return np.where(np.isfinite(scale), scale / typical, 1.0)


def _test(x_all: np.ndarray, lower: Mode, uppers: Sequence[Mode], bic_gain: float,
          vs: str) -> Tuple[list, float, float]:
    """(failed tests in words, separation D, mode ratio) of a fit with bulk ``lower`` and ``uppers``."""
    upper = uppers[0]
    d = math.sqrt(2) * (upper.mean - lower.mean) / math.sqrt(lower.sigma ** 2 + upper.sigma ** 2)
    ratio = math.exp(upper.mean - lower.mean)
    weight = sum(u.weight for u in uppers)
    failures = []
    if bic_gain < MIN_BIC_GAIN:
        failures.append(f"{BIC_FAILS} {vs} = {bic_gain:.1f} < {MIN_BIC_GAIN:g})")
    if weight > MAX_UPPER_WEIGHT:
        failures.append(f"the upper mode holds {100 * weight:.1f} % of the tokens (artifacts are a "
                        f"minority, at most {100 * MAX_UPPER_WEIGHT:g} %)")
    if d < MIN_SEPARATION:
        failures.append(f"the modes are not separated (D {d:.2f} < {MIN_SEPARATION:g})")
    if ratio < MIN_MODE_RATIO:
        failures.append(f"the upper mode is only {ratio:.2f}x the bulk (at least {MIN_MODE_RATIO:g}x)")
    if not failures:
        cut = _best_cut(lower, *uppers)
        above = int(x_all.size - np.searchsorted(x_all, cut, side="right"))
        if above < MIN_UPPER_TOKENS:  # tokens counted above the cut, not weight x n (3 tokens fit at 2.99999)
            failures.append(f"{above} tokens are above the cut (at least {MIN_UPPER_TOKENS})")
    return failures, d, ratio


def _rejected(n: int, n_fit: int, reason: str, lower=None, upper=None, d=0.0, ratio=1.0, bic1=None,
              bic2=None, **extra) -> NormSplit:
    return NormSplit(n, n_fit, lower, upper, d, ratio, bic1, bic2, False, reason, math.inf, 0.0, **extra)


def split_norms(norms: np.ndarray, normalisation: Optional[str] = None) -> NormSplit:
    """Fit one, two and three Gaussians to log(norms) and test for a separated minority high-norm mode.

    Args:
        norms: positive norms: [N images, P patches], or any other shape (one pool of tokens); non-finite
            values are ignored.
        normalisation: "per_image_p10" (default for [N, P]: each image's norms over its 10th percentile,
            relative to the median image's) or "none" (default for other shapes: the pooled norms).

    Returns:
        :class:`NormSplit` (``accepted``, ``threshold`` and ``reason`` say what was decided and why). The
        same norms again (the same bytes and shape) give the same object, from the last 16 splits kept.
    """
    arr = np.ascontiguousarray(norms, dtype=np.float64)
    if normalisation is None:
        normalisation = "per_image_p10" if arr.ndim == 2 else "none"
    key = (hashlib.blake2b(arr.tobytes(), digest_size=16).hexdigest(), arr.shape, normalisation)
    if key in _RECENT:
        _RECENT.move_to_end(key)
        return _RECENT[key]
    split = _split(arr, normalisation)
    _RECENT[key] = split
    if len(_RECENT) > _RECENT_MAX:
        _RECENT.popitem(last=False)
    return split


def _split(arr: np.ndarray, normalisation: str) -> NormSplit:
    """:func:`split_norms` on float64 ``arr`` with the normalisation decided."""
    scales = _image_scales(arr, normalisation)
    if scales is not None:
        arr = arr / scales[:, None]
    extra = dict(normalisation=normalisation, image_scales=None if scales is None else tuple(map(float, scales)))
    x_all = _log_norms(arr)
    n = int(x_all.size)
    if n < MIN_TOKENS:
        return _rejected(n, n, f"too few tokens ({n}) to test for a separate mode (at least {MIN_TOKENS})",
                         **extra)
    spread = float(x_all.std())
    if spread < 1e-9:
        return _rejected(n, n, "all norms are equal: there is a single mode", **extra)
    x = _fit_points(x_all)
    floor = max(1e-3 * spread, 1e-6)
    two, _ = best_fit(x, 2, floor)
    three, _ = best_fit(x, 3, floor)
    bic1 = -2 * mixture_loglik(x_all, np.array([[1.0, x_all.mean(), spread]])) + 2 * math.log(n)
    bic2 = -2 * mixture_loglik(x_all, two) + 5 * math.log(n)
    bic3 = None if three is None else -2 * mixture_loglik(x_all, three) + 8 * math.log(n)
    lower, upper = (Mode(float(m), float(s), float(w)) for w, m, s in two)
    failures, d, ratio = _test(x_all, lower, [upper], bic1 - bic2, "one mode (BIC 1 - BIC 2")
    uppers = [upper]
    if three is not None and bic3 <= bic2 - MIN_BIC_GAIN:
        low3, *up3 = (Mode(float(m), float(s), float(w)) for w, m, s in three)
        failures3, d3, ratio3 = _test(x_all, low3, up3, min(bic1, bic2) - bic3, "fewer modes (BIC 1 or 2 - BIC 3")
        if not failures3:
            failures, d, ratio, lower, uppers = [], d3, ratio3, low3, up3
    few = None  # a handful of tokens: judged by their chance as bulk tokens, not by BIC (few_tokens.py)
    if len(uppers) == 1 and upper.weight * n <= FEW_TOKENS and all(f.startswith(BIC_FAILS) for f in failures):
        few = few_tokens(x_all)
        if few is not None:
            failures = []
        elif failures:
            failures[0] += "; its largest tokens could be bulk tokens (few_tokens.py)"
    fitted = dict(lower=lower, upper=uppers[0], d=d, ratio=ratio, bic1=bic1, bic2=bic2, **extra,
                  more_upper=tuple(uppers[1:]), bic_three=bic3)
    if failures:
        return _rejected(n, int(x.size), "; ".join(failures), **fitted)
    if few is None:
        cut, rule, precision, recall = _cut(x_all, lower, uppers)
    else:
        cut, rule = few[2], "few_tokens"
        tp, fp = (float(v[0]) for v in _expected(lower, uppers, np.array([cut])))
        precision, recall = tp / max(tp + fp, 1e-300), tp / uppers[0].weight
    threshold = float(math.exp(cut))
    share = float(1 - np.searchsorted(x_all, cut, side="right") / n)
    modes = "two modes" if len(uppers) == 1 else "three modes (two above the bulk)"
    reason = (f"BIC prefers {modes} (BIC 1 - BIC {len(uppers) + 1} = "
              f"{bic1 - (bic2 if len(uppers) == 1 else bic3):.1f}), and the upper one is a minority, "
              f"separated (D >= {MIN_SEPARATION:g}) and at least {MIN_MODE_RATIO:g}x the bulk")
    if rule == "few_tokens":
        reason = (f"the {few[0]} largest tokens are a mode of their own (as bulk tokens: chance {few[1]:.2g} < "
                  f"{MAX_CHANCE:g}; at least {MIN_MODE_RATIO:g}x the median; the tokens below them an ordinary "
                  f"tail; BIC 1 - BIC 2 = {bic1 - bic2:.1f}): the cut lies half-way between them and the next")
    if rule == "gap_middle":
        reason += (f"; the bulk is degenerate (log-sigma {lower.sigma:.2g} < {MIN_BULK_SIGMA:g}), so the cut is "
                   f"the middle of the gap in norm, {threshold:.4g}")
    return NormSplit(n, int(x.size), lower, uppers[0], d, ratio, bic1, bic2, True, reason, threshold, share,
                     precision, recall, rule, **{k: fitted[k] for k in ("normalisation", "image_scales",
                                                                         "more_upper", "bic_three")})
