"""Studies: each reads activations through an ActivationSource and returns a JSON-serialisable result.

The public API, one place for every study and the contract they share::

    from interp.studies import norms_study, NormsResult, NormsConfig, detect, open_source

- every declared study's function, result class and config (``patch_score_study``, ``PatchScoreResult``,
  ``PatchScoreConfig``), as its config names them (:mod:`interp.studies.catalog`): a new study needs no line
  here;
- the contract: activation sources (``open_source``, ``LiveSource``, ``CacheSource``, ...), the detection of
  high-norm tokens (``detect``, ``Detection``, ``DetectionSpec``, ``detect_norms``), results (``StudyResult``),
  the hooks a study reads (``required_hooks``) and the probe kernel (``linear_probe``).

Names load on first use (PEP 562), so the command line reads the torch-free declarations under this package
without importing torch.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Tuple

from .catalog import declared, result_class, study_function

# the contract shared by the studies: public name -> module that defines it
_CONTRACT = {
    "StudyResult": "interp.studies.core.result", "OutlierStudyResult": "interp.studies.core.result",
    "ActivationSource": "interp.runtime.source", "Batch": "interp.runtime.source",
    "CacheSource": "interp.runtime.cache_source", "LiveSource": "interp.runtime.live_source",
    "open_source": "interp.runtime.open", "run_hooks": "interp.runtime.forward",
    "DetectionSpec": "interp.detection.detection", "RunOptions": "interp.detection.detection",
    "Detection": "interp.detection.detection", "detect": "interp.detection.detection",
    "detect_norms": "interp.detection.thresholds",
    "StudyConfig": "interp.studies.declaration", "required_hooks": "interp.studies.catalog",
    "linear_probe": "interp.studies.probes.linear_probe", "ProbeFit": "interp.studies.probes.linear_probe",
}


def _study_names() -> Dict[str, Tuple[str, Any]]:
    """``{public name: (kind, config class)}`` for every declared study: its function, result and config."""
    names: Dict[str, Tuple[str, Any]] = {}
    for config in declared().values():
        names.update({config.function: ("function", config), config.result: ("result", config),
                      config.__name__: ("config", config)})
    return names


def _resolve(name: str) -> Any:
    if name in _CONTRACT:
        return getattr(importlib.import_module(_CONTRACT[name]), name)
    kind, config = _study_names()[name]
    if kind == "config":
        return config
    if kind == "function":
        return study_function(config)
    return result_class(config)


__all__ = sorted([*_CONTRACT, *_study_names()])


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = _resolve(name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
