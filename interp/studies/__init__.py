"""Studies: each reads activations through an ActivationSource and returns a JSON-serialisable result.

The names below are resolved lazily (PEP 562), so ``interp.studies.core.descriptors`` (what each study is and
which hooks it reads) can be imported by the command line without importing torch. Each name is defined in the
module given here (the activation sources and the forward primitive live in :mod:`interp.runtime`).
"""
from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_LAZY = {
    "StudyResult": "interp.studies.core.result", "OutlierStudyResult": "interp.studies.core.result",
    "ActivationSource": "interp.runtime.source", "Batch": "interp.runtime.source",
    "CacheSource": "interp.runtime.cache_source", "LiveSource": "interp.runtime.live_source",
    "open_source": "interp.runtime.open",
    "DetectionSpec": "interp.studies.core.detection", "RunOptions": "interp.studies.core.detection",
    "Detection": "interp.studies.core.outliers", "detect": "interp.studies.core.outliers",
    "detect_norms": "interp.studies.core.thresholds",
    "StudyDescriptor": "interp.studies.core.descriptors", "DESCRIPTORS": "interp.studies.core.descriptors",
    "required_hooks": "interp.studies.core.descriptors",
    "run_hooks": "interp.runtime.forward",
    "linear_probe": "interp.studies.probes.linear_probe", "ProbeFit": "interp.studies.probes.linear_probe",
    "ProbeResult": "interp.studies.probes.linear_probe",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
