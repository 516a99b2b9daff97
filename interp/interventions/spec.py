"""Interventions from a JSON-able spec (the ``--interventions SPEC.json`` file of ``interp patch export``).

A spec is a list of objects, each with ``"kind"`` and that class's parameters::

    [
      {"kind": "TestTimeRegister", "neurons": {"5": [12, 40]}, "value": "layer_max"},
      {"kind": "Relocation", "neurons": {"5": [12, 40]}, "target": "smiley"},
      {"kind": "NeuronAblation", "neurons": {"3": [7]}, "mode": "mean", "tokens": "patches"},
      {"kind": "AttentionBias", "neurons": {"5": [12, 40]}},
      {"kind": "SelectiveCLS", "k": 1, "score": "paper", "fft": "shift"}
    ]

``Relocation.target`` may be ``"smiley"``, ``{"box": [top, left, height, width]}``,
``{"indices": [flat or [row, col], ...]}``, ASCII art (a string with newlines or a list of row strings),
or a nested list of 0/1. ``NeuronAblation`` with ``mode="mean"`` and no ``means``, and ``AttentionBias``
without ``keys``/``values`` (it may give ``n_registers``/``value`` of the register to imitate) are
calibrated on ``calibration_images``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from ..errors import InterpError
from . import masks
from .ablation import NeuronAblation
from .attention_bias import AttentionBias
from .base import Intervention


def parse_target(target: Any, grid: Optional[Sequence[int]]) -> torch.Tensor:
    """A relocation mask [h, w] from its spec form (module docstring)."""
    if isinstance(target, str) and target.strip() == "smiley":
        if grid is None:
            raise InterpError("target 'smiley' needs the model's patch grid (give the model)")
        return masks.smiley(grid)
    if isinstance(target, str):
        return masks.from_string(target)
    if isinstance(target, dict):
        if "box" in target:
            if grid is None:
                raise InterpError("target {'box': ...} needs the model's patch grid (give the model)")
            return masks.box(grid, *target["box"])
        if "indices" in target:
            if grid is None:
                raise InterpError("target {'indices': ...} needs the model's patch grid (give the model)")
            return masks.from_indices(grid, target["indices"])
        raise InterpError(f"unknown target form {sorted(target)}; use 'smiley', box, indices or ASCII rows")
    if isinstance(target, list) and target and all(isinstance(r, str) for r in target):
        return masks.from_string("\n".join(target))
    return torch.as_tensor(target).bool()


def intervention_from_dict(spec: Dict[str, Any], model=None, calibration_images: Optional[torch.Tensor] = None,
                           batch_size: int = 32) -> Intervention:
    """One intervention from its spec dict (calibrating it when the spec asks for calibrated tensors)."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    cls = Intervention.registry.get(kind)
    if cls is None:
        raise InterpError(f"unknown intervention kind {kind!r}; known: {sorted(Intervention.registry)}")
    try:
        if cls is NeuronAblation and spec.get("mode") == "mean" and "means" not in spec:
            images = _need_images(kind, calibration_images)
            return NeuronAblation.calibrate_means(model, images, spec["neurons"], tokens=spec.get("tokens", "all"),
                                                  batch_size=batch_size)
        if cls is AttentionBias and "keys" not in spec:
            images = _need_images(kind, calibration_images)
            return AttentionBias.calibrate(model, images, batch_size=batch_size, **spec)
        if "target" in spec:
            spec["target"] = parse_target(spec["target"], None if model is None else model.layout.grid)
        if "means" in spec:
            spec["means"] = {int(l): torch.tensor(m, dtype=torch.float32) for l, m in spec["means"].items()}
        return cls(**spec)
    except (TypeError, ValueError, KeyError) as e:
        raise InterpError(f"bad {kind} spec {spec}: {e}") from e


def _need_images(kind: str, images):
    if images is None:
        raise InterpError(f"{kind} needs calibration: give calibration images (CLI: --calibration-images DIR)")
    return images


def interventions_from_spec(spec: Union[str, Path, List[Dict[str, Any]]], model=None,
                            calibration_images: Optional[torch.Tensor] = None,
                            batch_size: int = 32) -> List[Intervention]:
    """Interventions from a spec list or a JSON file holding one (a single object is accepted too)."""
    if isinstance(spec, (str, Path)):
        try:
            spec = json.loads(Path(spec).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InterpError(f"cannot read intervention spec {str(spec)!r}: {e}") from e
    if isinstance(spec, dict):
        spec = [spec]
    if not isinstance(spec, list) or not all(isinstance(s, dict) for s in spec):
        raise InterpError("an intervention spec is a list of objects with a 'kind' key")
    return [intervention_from_dict(s, model, calibration_images, batch_size) for s in spec]
