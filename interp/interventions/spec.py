"""Interventions from a JSON-able spec (the ``--interventions SPEC.json`` file of ``interp patch export``).

A spec is a list of objects, each with ``"kind"`` and that class's parameters::

    [
      {"kind": "TestTimeRegister", "neurons": {"5": [12, 40]}, "value": "layer_max"},
      {"kind": "Relocation", "neurons": {"5": [12, 40]}, "target": "smiley"},
      {"kind": "NeuronAblation", "neurons": {"3": [7]}, "mode": "mean", "tokens": "patches"},
      {"kind": "AttentionBias", "neurons": {"5": [12, 40]}},
      {"kind": "SelectiveCLS", "k": 1, "score": "code", "fft": "shift"}
    ]

``Relocation.target`` is any form of the one target grammar (:func:`interp.interventions.masks.parse_target`):
``"smiley"``, ``{"box": [top, left, height, width]}`` (or ``"box:T,L,H,W"``), ``{"indices": [flat or
[row, col], ...]}`` (or ``"indices:I,J"``), ASCII art (a string with newlines or a list of row strings), or a
nested list of 0/1. ``NeuronAblation`` with ``mode="mean"`` and no ``means``, and ``AttentionBias`` without
``keys``/``values`` (it may give ``n_registers``/``value`` of the register to imitate) are calibrated on
``calibration_images``. Every kind also reads back its own ``to_spec()`` (tensors under ``"tensors"``).

Kinds come from the registry ``Intervention.registry`` (kind -> class; a subclass with a ``kind`` registers
itself); each class reads its spec entry with ``from_spec(entry, inputs)``. A new intervention is a new module
in this package, imported in ``interp/interventions/__init__.py``: nothing here changes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ..errors import InterpError
from ..paths import check_input_path
from .base import Intervention


@dataclass
class SpecInputs:
    """What spec entries may need besides their parameters: the model (grid, calibration) and images."""

    model: Any = None
    calibration_images: Optional[torch.Tensor] = None
    batch_size: int = 32

    @property
    def grid(self) -> Optional[Tuple[int, int]]:
        return None if self.model is None else tuple(self.model.layout.grid)

    def images(self, kind: str) -> torch.Tensor:
        if self.model is None or self.calibration_images is None:
            raise InterpError(f"{kind} needs calibration: give the model and calibration images "
                              "(CLI: --calibration-images DIR)")
        return self.calibration_images


def intervention_from_dict(spec: Dict[str, Any], model=None, calibration_images: Optional[torch.Tensor] = None,
                           batch_size: int = 32) -> Intervention:
    """One intervention from its spec dict (calibrating it when the spec asks for calibrated tensors)."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    cls = Intervention.registry.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InterpError(f"unknown intervention kind {kind!r}; known: {sorted(Intervention.registry)}")
    try:
        return cls.from_spec(spec, SpecInputs(model, calibration_images, batch_size))
    except InterpError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise InterpError(f"bad {kind} spec {str(spec)[:200]}: {e}") from e


def interventions_from_spec(spec: Union[str, Path, List[Dict[str, Any]]], model=None,
                            calibration_images: Optional[torch.Tensor] = None,
                            batch_size: int = 32) -> List[Intervention]:
    """Interventions from a spec list or a JSON file holding one (a single object is accepted too)."""
    if isinstance(spec, (str, Path)):
        check_input_path(spec, "intervention spec")
        try:
            spec = json.loads(Path(spec).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            reason = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
            raise InterpError(f"cannot read intervention spec {str(spec)!r} ({reason}); give a JSON list of "
                              "objects with a 'kind' key") from None
    if isinstance(spec, dict):
        spec = [spec]
    if not isinstance(spec, list) or not all(isinstance(s, dict) for s in spec):
        raise InterpError("an intervention spec is a list of objects with a 'kind' key")
    return [intervention_from_dict(s, model, calibration_images, batch_size) for s in spec]
