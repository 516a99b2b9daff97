"""The SAE line's high-norm detection in bounded memory: the threshold is resolved
(:func:`~interp.detection.thresholds.resolve_threshold`) on the patch-token norms of at most
``MAX_DETECTION_IMAGES`` images (every image when there are no more, else a sample drawn with the fixed seed
``SAMPLE_SEED``), and each image's high-norm tokens are decided from its own norms whenever it is read: above
the fitted cut, which "auto" scales by the image's own 10th-percentile norm over the fitted images' median (what
the detection does to every image it is given). Nothing of size [N images, P patches] is kept, so memory does
not grow with the data set (docs/methods.md, "Sparse autoencoders").

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> norms = rng.lognormal(3.0, 0.1, (40, 50)); norms[:, :2] *= 8           # two high-norm patches per image
>>> found = fit_detection(norms, "auto", n_images=40)
>>> found.artifacts_found, int(found.outliers(norms).sum())
(True, 80)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np

from ..detection.norm_split import SCALE_PERCENTILE
from ..detection.thresholds import Threshold, ThresholdSpec, resolve_threshold
from ..errors import InterpError

# 4096 images of ViT-L/14 (256 patches) are 8 MB of float64 norms: enough tokens (1M) for the two-mode fit,
# which runs on at most 10 000 order statistics anyway (interp.detection.norm_split.MAX_FIT_POINTS).
MAX_DETECTION_IMAGES = 4096
SAMPLE_SEED = 17


def detection_sample(n_images: int, max_images: Optional[int] = None) -> np.ndarray:
    """Sorted indices of the images the threshold is fitted on: all of them up to ``max_images`` (default
    ``MAX_DETECTION_IMAGES``), else a sample of that many drawn with ``SAMPLE_SEED``."""
    cap = MAX_DETECTION_IMAGES if max_images is None else int(max_images)
    if n_images <= cap:
        return np.arange(n_images)
    return np.sort(np.random.default_rng(SAMPLE_SEED).choice(n_images, cap, replace=False))


def _p10(norms: np.ndarray) -> np.ndarray:
    """Each image's 10th-percentile norm ([b], NaN where undefined): the image scale of the two-mode split's
    "per_image_p10" normalisation (interp.detection.norm_split), computed the same way."""
    masked = np.where(np.isfinite(norms) & (norms > 0), norms, np.nan)
    scale = np.nanpercentile(masked, SCALE_PERCENTILE, axis=1) if masked.size else np.ones(norms.shape[0])
    return np.where(np.isfinite(scale) & (scale > 0), scale, np.nan)


@dataclass(frozen=True)
class SampledDetection:
    """A threshold fitted on some images' patch norms, applied to any image's norms.

    Attributes:
        threshold: the resolved :class:`~interp.detection.thresholds.Threshold` on the fitted images (its
            ``n_tokens``/``n_above``/``image_values`` are theirs).
        n_images: images the detection applies to; n_fitted: images the threshold was fitted on.
        typical: the fitted images' median 10th-percentile norm when each image has its own cut ("auto" with
            an accepted split), else None.
    """

    threshold: Threshold
    n_images: int
    n_fitted: int
    typical: Optional[float] = None

    @property
    def artifacts_found(self) -> bool:
        return self.threshold.artifacts_found

    def describe(self) -> str:
        return self.threshold.describe()

    def cuts(self, norms: np.ndarray) -> np.ndarray:
        """float64 [b]: each image's cut for its patch norms [b, P]."""
        grid = np.asarray(norms, dtype=np.float64)
        if self.typical is None:
            return np.full(grid.shape[0], self.threshold.value)
        scale = _p10(grid)
        return self.threshold.value * np.where(np.isfinite(scale), scale / self.typical, 1.0)

    def outliers(self, norms: np.ndarray) -> np.ndarray:
        """Bool [b, P]: the high-norm patches among patch norms [b, P] (any images, read in any order)."""
        grid = np.asarray(norms, dtype=np.float64)
        return grid > self.cuts(grid)[:, None]

    def to_dict(self) -> Dict[str, Any]:
        """The verdict for a result file (without the per-image cuts), with the images it was fitted on."""
        t = self.threshold.to_dict()
        return {"where": "patch-token norms at the SAE's hook", "artifacts_found": t["artifacts_found"],
                "method": t["method"], "value": t["value"], "n_tokens": t["n_tokens"], "n_above": t["n_above"],
                "share_above": t["share_above"], "reason": t["reason"], "warning": t["warning"],
                "n_images": self.n_images, "fitted_on_images": self.n_fitted}


def fit_detection(norms: np.ndarray, threshold: ThresholdSpec, n_images: int) -> SampledDetection:
    """Resolve ``threshold`` on the patch norms [m, P] of the fitted images (``detection_sample``'s) of a set of
    ``n_images`` images. On all images it marks exactly the tokens ``detect_norms`` marks."""
    grid = np.asarray(norms, dtype=np.float64)
    if grid.ndim != 2:
        raise InterpError(f"norms must be [N images, P patches], got shape {tuple(grid.shape)}")
    found = resolve_threshold(grid, threshold)
    typical = None
    if found.image_values is not None:
        scale = _p10(grid)
        typical = float(np.nanmedian(scale)) if np.isfinite(scale).any() else 1.0
    return SampledDetection(found, int(n_images), int(grid.shape[0]), typical)
