"""Figures of the artifact studies: high-norm tokens, register neurons, ablation, relocation and
test-time registers (docs/methods.md sections 1-2), under one name.

The figures live in ``plots/norms.py`` (norms study) and ``plots/causal.py`` (neurons, ablation,
relocation, test-time register), their shared helpers in ``plots/common.py``, and the table of which
figures each result gets in ``plots/registry.py``.

Every function takes a study result (and optionally the images it was run on, for overlays) and returns a
``matplotlib.figure.Figure``; none recomputes a study. A result with nothing to show (no high-norm tokens,
no ranked neurons) gives a figure that says so instead of an error.

>>> from interp.studies.artifacts.norms import norms_study
>>> result = norms_study(source, progress=False)
>>> fig = norm_profile(result)
>>> fig.savefig("norm_profile.png", dpi=110, bbox_inches="tight")
>>> for name, fig in study_figures(result, images):     # every figure of one result
...     fig.savefig(f"{name}.png", dpi=110)
"""
from __future__ import annotations

from .causal import ABLATION_METRICS, ablation_bars, neuron_scores, register_summary, relocation_maps
from .common import (ATTN_COLOR, MAX_PANELS, MLP_COLOR, NO_ARTIFACTS, OUTLIER_RGBA, TARGET_COLOR, THRESHOLD_COLOR,
                     display_arrays, message_figure, short_name)
from .norms import norm_histograms, norm_profile, outlier_maps
from .registry import FIGURES, study_figures

__all__ = ["norm_histograms", "norm_profile", "outlier_maps", "neuron_scores", "ablation_bars", "relocation_maps",
           "register_summary", "study_figures", "FIGURES", "message_figure", "short_name",
           "display_arrays", "NO_ARTIFACTS", "MAX_PANELS", "ABLATION_METRICS", "ATTN_COLOR", "MLP_COLOR",
           "THRESHOLD_COLOR", "OUTLIER_RGBA", "TARGET_COLOR"]
