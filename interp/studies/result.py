"""The base of every study result: a dataclass that serialises to JSON with its parameters,
the model's name and weights fingerprint, and the seed."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, ClassVar, Dict, Optional, Type, TypeVar, Union

import numpy as np
import torch

R = TypeVar("R", bound="StudyResult")


def jsonable(obj: Any) -> Any:
    """Tensors/arrays -> nested lists, dataclasses -> dicts, NaN/inf -> None, recursively."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, torch.Tensor):
        return jsonable(obj.detach().cpu().numpy())
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


@dataclasses.dataclass
class StudyResult:
    """Common header of all study results.

    Attributes:
        model: model name.
        fingerprint: weights fingerprint of the model (or of the cache's model).
        params: the study's parameters, as passed (JSON-safe).
        seed: random seed used (None when the study draws nothing at random).
    """

    study: ClassVar[str] = "study"
    model: str
    fingerprint: str
    params: Dict[str, Any]
    seed: Optional[int]

    def to_dict(self) -> dict:
        return {"study": self.study, **jsonable(self)}

    def to_json(self, path: Union[str, Path, None] = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls: Type[R], data: dict) -> R:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_json(cls: Type[R], path: Union[str, Path]) -> R:
        return cls.from_dict(json.loads(Path(path).read_text()))
