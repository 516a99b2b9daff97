"""Thresholds on patch-token norms and their verdict on artifacts: fixed, per-model percentile or the automatic
two-mode split of the log norms (:mod:`interp.detection.norm_split`), resolved by :func:`resolve_threshold`;
:func:`detect_norms` for norms computed elsewhere. Detection over a source is :mod:`.outliers`.

>>> import numpy as np
>>> norms = np.full((2, 100), 50.0) * np.linspace(0.9, 1.1, 100)   # two images, no separate high-norm mode
>>> detect_norms(norms).artifacts_found
False
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import InterpError
from .norm_split import NormSplit, split_norms

ThresholdSpec = Union[float, int, str]

# The tokens above a fixed or percentile threshold are artifacts while they are a minority of this share;
# above it the threshold cuts into the bulk, unless the automatic split finds them to be its separated upper
# mode (the planted model's flat patches can be a third of a photo).
MAX_ARTIFACT_SHARE = 0.2
# A threshold warns when this share of the tokens above it are bulk tokens (below an accepted automatic
# split): it counts ordinary tokens too.
MAX_BULK_ABOVE = 0.1


class ThresholdError(InterpError, ValueError):
    """A threshold that cannot mean anything: non-positive, not finite, or a percentile outside (0, 100)."""


@dataclass(frozen=True)
class Threshold:
    """A resolved outlier threshold and what it says about artifacts.

    Attributes:
        value: norm above which a patch token is an outlier (inf when "auto" finds no separated mode). For
            "auto" on norms [N, P] each image has its own cut (``image_values``) and ``value`` is the cut of an
            image whose scale (10th-percentile norm) is the median image's: the one number studies that count
            outliers in other forwards (ablation, relocation, registers, masking) count above.
        method: "fixed", "percentile" or "auto".
        split: the two-mode test on the same norms (:func:`~interp.detection.norm_split.split_norms`); it
            decides "auto" and the percentile case, and is only a diagnostic for a fixed value.
        n_tokens, n_above: patch tokens tested, and those above ``value``.
        artifacts_found: "auto": the split was accepted; fixed: some tokens are above the value and they are a
            minority (at most ``MAX_ARTIFACT_SHARE``); percentile: the tokens above it include a separated
            minority mode (the split was accepted) and are a minority.
        reason: one sentence with the numbers saying why artifacts were or were not found.
        warning: a caveat that does not change ``artifacts_found`` (the threshold lies inside the bulk), or None.
        image_values: "auto" on norms [N, P]: each image's own cut ([N], ``value`` x the image's scale, see
            :class:`~interp.detection.norm_split.NormSplit`); None for a fixed or percentile threshold.
    """

    value: float
    method: str
    split: NormSplit
    n_tokens: int = 0
    n_above: int = 0
    artifacts_found: bool = False
    reason: str = ""
    warning: Optional[str] = None
    image_values: Optional[Tuple[float, ...]] = None

    def cuts(self, rows: Sequence[int]) -> "float | torch.Tensor":
        """The cut of each image of ``rows`` (indices into the detected images) as a float64 [b, 1] tensor, to
        compare with a batch's norms [b, t]; ``value`` itself when there are no per-image cuts."""
        if self.image_values is None:
            return self.value
        return torch.tensor([self.image_values[i] for i in rows], dtype=torch.float64)[:, None]

    def mask(self, norms) -> "torch.Tensor | np.ndarray":
        """Bool mask of the outliers among ``norms`` [N, P] (a tensor or an array, answered in kind): above
        each image's own cut when there are per-image cuts, else above ``value``."""
        cuts = self.value if self.image_values is None else np.asarray(self.image_values, np.float64)[:, None]
        if isinstance(norms, torch.Tensor):  # compared in float64, as detect_norms compares arrays
            return norms.double() > (torch.from_numpy(cuts) if self.image_values is not None else cuts)
        return np.asarray(norms, dtype=np.float64) > cuts

    @property
    def bimodal(self) -> bool:
        """Whether the norms have a separated minority high-norm mode (the split's verdict)."""
        return self.split.accepted

    @property
    def mode_ratio(self) -> float:
        """The fitted upper mode's norm over the bulk's (1.0 without a fit)."""
        return self.split.mode_ratio

    @property
    def share_above(self) -> float:
        return self.n_above / self.n_tokens if self.n_tokens else 0.0

    def describe(self) -> str:
        """One line that agrees with the numbers: the verdict, its reason and the split diagnostic."""
        head = "artifacts found" if self.artifacts_found else "no artifacts"
        text = f"{head}: {self.reason}"
        if self.method != "auto":
            verdict = "accepted" if self.split.accepted else "rejected"
            text += f" (automatic split {verdict}: {self.split.describe()})"
        return text + (f"; warning: {self.warning}" if self.warning else "")

    def to_dict(self) -> Dict:
        """JSON-ready detection diagnostics (the split's fitted modes, separation, BIC and verdict)."""
        return {"method": self.method, "value": self.value if math.isfinite(self.value) else None,
                "n_tokens": self.n_tokens, "n_above": self.n_above, "share_above": self.share_above,
                "artifacts_found": self.artifacts_found, "reason": self.reason, "warning": self.warning,
                "image_values": None if self.image_values is None else list(self.image_values),
                "split": self.split.to_dict()}


def parse_threshold(spec: ThresholdSpec) -> Tuple[str, Optional[float]]:
    """'auto' -> ("auto", None); 'p98' -> ("percentile", 98); '150' or 150 -> ("fixed", 150).

    Raises :class:`ThresholdError` for a non-positive or non-finite value and a percentile outside (0, 100)."""
    if isinstance(spec, bool):
        raise ThresholdError(f"threshold {spec!r} must be a number, pNN (e.g. p98) or auto")
    if isinstance(spec, (int, float)):
        method, value = "fixed", float(spec)
    else:
        text = str(spec).strip().lower()
        if text == "auto":
            return "auto", None
        if text.startswith("p"):
            try:
                q = float(text[1:])
            except ValueError:
                q = math.nan
            if not 0 < q < 100:
                raise ThresholdError(f"percentile threshold {spec!r} must look like p98, with 0 < NN < 100")
            return "percentile", q
        try:
            method, value = "fixed", float(text)
        except ValueError:
            raise ThresholdError(f"threshold {spec!r} must be a number, pNN (e.g. p98) or auto") from None
    if not math.isfinite(value) or value <= 0:
        raise ThresholdError(f"threshold {spec!r} must be a positive norm (a norm is never <= 0; every token "
                             "would be an outlier), pNN (e.g. p98) or auto")
    return method, value


def _bulk_above(value: float, norms: np.ndarray, split: NormSplit) -> Optional[float]:
    """Share of the tokens above ``value`` that are bulk tokens under the split (below their image's cut);
    None when the split was rejected (there is no bulk/mode boundary to compare with) or nothing is above.
    ``norms``: [N, P] (or one pool of tokens when the split has no per-image scales)."""
    above = int((norms > value).sum())
    if not split.accepted or above == 0:
        return None
    cuts = split.image_thresholds(1)[:, None]  # [N, 1], or [1, 1] without per-image scales
    bulk = norms.reshape(cuts.shape[0], -1) <= cuts
    return int(((norms.reshape(bulk.shape) > value) & bulk).sum()) / above


def percentile_value(norms: np.ndarray, p: float) -> float:
    """The ``p``-th percentile of the norms (inf when there are none): what a ``pNN`` threshold resolves to."""
    return float(np.percentile(norms, p)) if norms.size else math.inf


def resolve_threshold(patch_norms: np.ndarray, spec: ThresholdSpec = "auto") -> Threshold:
    """Threshold for ``spec`` on the detection layer's patch norms and the verdict on artifacts (see
    :class:`Threshold`): the one place where thresholds are resolved and judged.

    ``patch_norms``: [N images, P patches] (the split normalises each image by its scale, "per_image_p10"),
    or any other shape (one pool of tokens, no per-image scale).

    * ``"auto"``: the cut of an accepted two-mode split (:func:`~interp.detection.norm_split.split_norms`);
      artifacts when it is accepted, none (value inf) when it is rejected.
    * a fixed value: the tokens above it are the outliers (the papers' definition); artifacts when there are
      some and they are a minority (at most ``MAX_ARTIFACT_SHARE``, or more when the split finds them to be
      its separated upper mode); above that, the threshold cuts into the bulk. The split is only reported.
    * ``"pNN"``: the per-model percentile; artifacts when the split finds a separated mode among the tokens
      above it (and they are a minority, as for a fixed value).
    A threshold that finds artifacts while ``MAX_BULK_ABOVE`` or more of the tokens above it are bulk tokens
    under the split carries a ``warning``.
    """
    method, asked = parse_threshold(spec)
    grid = np.asarray(patch_norms, dtype=np.float64)
    split = split_norms(grid)
    norms = grid.ravel()
    n = int(norms.size)
    per_image = method == "auto" and split.accepted and split.image_scales is not None
    if method == "fixed":
        value, name = asked, f"the fixed threshold {asked:.4g}"
    elif method == "percentile":
        value = percentile_value(norms, asked)
        name = f"the percentile threshold p{asked:g} ({value:.4g})"
    else:
        value, name = split.threshold, "the automatic split"
    image_values = tuple(map(float, split.image_thresholds())) if per_image else None
    above = int((grid > np.asarray(image_values)[:, None]).sum()) if per_image else int((norms > value).sum())
    share = above / n if n else 0.0
    bulk = _bulk_above(value, grid, split) if method != "auto" else None
    inside = bulk is not None and bulk >= MAX_BULK_ABOVE
    warning = None
    if method == "auto":
        found = split.accepted and above > 0
        at = (f"their image's cut of the automatic split ({value:.4g} for the median image's scale)" if per_image
              else f"the automatic split at {value:.4g}")
        reason = (f"{100 * share:.2f} % of the patch tokens are above {at} ({split.describe()}; {split.reason})"
                  if found else
                  f"automatic split rejected: {split.reason}; {split.describe()}")
    elif n == 0:
        found, reason = False, "there are no patch tokens to test"
    elif above == 0:
        found, reason = False, f"no patch token is above {name} (largest norm {norms.max():.4g})"
    elif share > MAX_ARTIFACT_SHARE and (bulk is None or inside):
        found = False
        why = ("the automatic split finds no separate mode" if bulk is None else
               f"{100 * bulk:.1f} % of them are below the automatic split at {split.threshold:.4g}")
        reason = (f"{name} cuts into the bulk: {100 * share:.2f} % of the patch tokens are above it (artifacts "
                  f"are a minority, at most {100 * MAX_ARTIFACT_SHARE:g} %, and {why})")
    elif method == "percentile" and not split.accepted:
        found = False
        reason = (f"the {100 * share:.2f} % of the patch tokens above {name} are not a separate mode (automatic "
                  f"split rejected: {split.reason})")
    else:
        found = True
        reason = f"{100 * share:.2f} % of the patch tokens are above {name}"
        if share > MAX_ARTIFACT_SHARE:
            reason += (f" (more than {100 * MAX_ARTIFACT_SHARE:g} %, but they are the separated upper mode of "
                       "the automatic split)")
        if inside:
            warning = (f"the threshold {value:.4g} lies inside the bulk: {100 * bulk:.1f} % of the tokens above "
                       f"it are below the automatic split at {split.threshold:.4g}")
    return Threshold(value=float(value), method=method, split=split, n_tokens=n, n_above=above,
                     artifacts_found=found, reason=reason, warning=warning, image_values=image_values)


@dataclass(frozen=True)
class NormsDetection:
    """The verdict and the outliers of :func:`detect_norms`.

    Attributes:
        threshold: the resolved :class:`Threshold` (verdict, reason, the split's diagnostics).
        outliers: Bool[N, P], the tokens above their image's cut (numpy).
    """

    threshold: Threshold
    outliers: np.ndarray

    @property
    def artifacts_found(self) -> bool:
        return self.threshold.artifacts_found

    def describe(self) -> str:
        return self.threshold.describe()


def detect_norms(norms, threshold: ThresholdSpec = "auto") -> NormsDetection:
    """High-norm tokens among patch norms computed elsewhere: the verdict and outlier mask :func:`detect`
    gives on a source whose detection-block norms are ``norms`` (it calls this function).

    Args:
        norms: [N images, P patches] positive norms (numpy array or tensor).
        threshold: a norm, ``"pNN"`` or ``"auto"`` (see :func:`resolve_threshold`).
    """
    grid = norms.detach().cpu().double().numpy() if isinstance(norms, torch.Tensor) else np.asarray(norms, float)
    if grid.ndim != 2:
        raise InterpError(f"norms must be [N images, P patches], got shape {tuple(grid.shape)}; "
                          "reshape a single image to [1, P]")
    found = resolve_threshold(grid, threshold)
    return NormsDetection(found, found.mask(grid))
