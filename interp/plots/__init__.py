"""Matplotlib figures drawn from study results only (no plot recomputes a study).

Every function returns a ``matplotlib.figure.Figure`` built without pyplot, so no GUI backend is
touched and figures are freed with their last reference. Each figure module registers its makers for the
result classes they draw (:func:`interp.plots.registry.figure`); importing this package registers them all.
"""
from . import aggregation, causal, causal_tools, norms, objects, probes, redundancy, repairs, sae, tokens  # noqa: F401  (they register their figures)
from .registry import figure, has_figures, study_figures  # noqa: F401

__all__ = ["aggregation", "causal", "causal_tools", "norms", "objects", "probes", "redundancy", "repairs", "sae", "tokens",
           "figure", "has_figures", "study_figures"]
