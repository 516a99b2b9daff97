"""Studies: each reads activations through an ActivationSource and returns a JSON-serialisable result.

The names below are resolved lazily (PEP 562), so ``interp.studies.core.descriptors`` (what each study is and
which hooks it reads) can be imported by the command line without importing torch.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
from typing import Any

# public name -> module under interp.studies
_LAZY = {
    "StudyResult": "core.result", "OutlierStudyResult": "core.result",
    "ActivationSource": "core.source", "Batch": "core.source", "CacheSource": "core.cache_source", "LiveSource": "core.source",
    "open_source": "core.source",
    "DetectionSpec": "core.detection", "RunOptions": "core.detection",
    "Detection": "core.outliers", "detect": "core.outliers", "detect_norms": "core.thresholds",
    "StudyDescriptor": "core.descriptors", "DESCRIPTORS": "core.descriptors", "required_hooks": "core.descriptors",
    "run_hooks": "core.forward",
    "linear_probe": "probes.linear_probe", "ProbeFit": "probes.linear_probe", "ProbeResult": "probes.linear_probe",
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


# Flat module paths of earlier versions -> their home; ``import interp.studies.norms`` gives the same module
# object as ``import interp.studies.artifacts.norms``.
MOVED = {
    **{m: f"core.{m}" for m in ("source", "cache_source", "detection", "outliers", "thresholds", "norm_split", "result", "forward", "presets",
                                "metrics", "descriptors")},
    **{m: f"artifacts.{m}" for m in ("norms", "emergence", "neurons", "register_scores", "ablate", "relocate",
                                     "registers")},
    **{m: f"aggregation.{m}" for m in ("patch_score", "pib", "pib_protocol", "masking")},
    "selective_pooling": "aggregation.selective_cls",
    **{m: f"objects.{m}" for m in ("lost", "segment", "boxes", "box_files")},
    "linear_probe": "probes.linear_probe",
    "compare": "interp.report.compare",  # an orchestrator now, beside the report
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import hook: ``interp.studies.<old name>`` resolves to the module at its new home (no copy, no stub file)."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.rpartition(".")
        if prefix == __name__ and name in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        home = MOVED[spec.name.rpartition(".")[2]]
        return importlib.import_module(home if home.startswith("interp.") else f"{__name__}.{home}")

    def exec_module(self, module):
        """The module was executed at its new home."""


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


class _Studies(types.ModuleType):
    """``interp.studies.linear_probe`` is the function (as it always was), not a module: importing the flat
    module path (:data:`MOVED`) would otherwise replace the package attribute with the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Studies
