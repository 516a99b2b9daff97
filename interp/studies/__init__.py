"""Studies: each reads activations through an ActivationSource and returns a JSON-serialisable result.

The names below are resolved lazily (PEP 562), so ``interp.studies.descriptors`` (what each study is and
which hooks it reads) can be imported by the command line without importing torch.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# public name -> module under interp.studies
_LAZY = {
    "StudyResult": "result", "OutlierStudyResult": "result",
    "ActivationSource": "source", "Batch": "source", "CacheSource": "source", "LiveSource": "source",
    "open_source": "source",
    "DetectionSpec": "detection", "RunOptions": "detection",
    "Detection": "outliers", "detect": "outliers",
    "StudyDescriptor": "descriptors", "DESCRIPTORS": "descriptors", "required_hooks": "descriptors",
    "run_hooks": "forward",
    "linear_probe": "linear_probe", "ProbeResult": "linear_probe",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))


class _Studies(types.ModuleType):
    """``interp.studies.linear_probe`` is the function (as it always was), not its submodule: importing the
    submodule would otherwise replace the package attribute with the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and _LAZY[name] == name and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Studies
