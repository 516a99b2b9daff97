"""Studies: each reads activations through an ActivationSource and returns a JSON-serialisable result."""
from .result import StudyResult
from .source import ActivationSource, Batch, CacheSource, LiveSource, open_source

__all__ = ["StudyResult", "ActivationSource", "Batch", "CacheSource", "LiveSource", "open_source"]

from .linear_probe import ProbeResult, linear_probe  # noqa: E402
__all__ += ["linear_probe", "ProbeResult"]
