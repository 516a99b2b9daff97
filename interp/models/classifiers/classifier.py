"""Classifier files: class logits [b, C] read from a forward of a ViT whose own head is not a classifier (a
CLIP projection, DINOv2's identity head), or a head other than the model's.

A classifier file is ``torch.save(dict)`` (read with ``torch.load(..., weights_only=True)``) with keys
``"interp_classifier": 1``, ``"kind"``, ``"weight"`` [C, D] and, by kind:

* ``"zeroshot"``: ``"logit_scale"`` (the multiplier itself, CLIP's ``logit_scale.exp()``, e.g. 100.0); the rows
  of ``weight`` are L2-normalised class text embeddings. Logits = ``logit_scale * normalize(e) @ weight.T``
  where ``e`` [b, D] is the model's output (``hook_logits``: for a CLIP image tower, the projection).
* ``"linear"``: ``"bias"`` [C] (optional). Logits = ``x @ weight.T + bias`` where ``x`` is the pooled vector
  ``hook_pooled`` [b, d'] when D = d', else the head output ``hook_logits`` when D is its width; an optional
  ``"input"`` key (``"pooled"`` | ``"head_output"``) decides when both widths are D. The choice is recorded.
* ``"dinov2_linear"``: ``"bias"``, ``"n_blocks"`` (1 or 4), ``"avgpool"`` (bool): the DINOv2 repository's linear
  head (``dinov2/eval/linear.py`` ``create_linear_input``, ``dinov2/hub/classifiers.py``): its input is the
  concatenation of the class tokens of the last ``n_blocks`` blocks, each after the final norm, and with
  ``avgpool`` the mean of the last block's normed patch tokens (registers excluded) [b, (n_blocks + avgpool) d].

Optional: ``"class_names"`` (C names), ``"model"`` (the timm name it was built for), ``"source"`` (free text).
DINOv2's released head files (plain ``{"weight", "bias"}`` state dicts, e.g. ``dinov2_vits14_linear4_head.pth``)
are read as ``dinov2_linear`` with ``avgpool`` and ``n_blocks`` from the width: D = 2 d -> 1, D = 5 d -> 4. A
``transformers`` ``Dinov2ForImageClassification`` folder's head is the same map (``n_blocks=1``, ``avgpool``).

>>> from interp.runtime.forward import run_hooks
>>> path = save_classifier("head.pt", "linear", torch.randn(3, 192), torch.zeros(3))   # C=3 over D=192
>>> clf = load_classifier(path).bind(model)       # checked against this model's widths (192: its pooled vector)
>>> run = run_hooks(model, images, classifier=clf, logits=True)
>>> run.logits.shape                              # [b, C]
torch.Size([4, 3])
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Union

import torch
import torch.nn.functional as F

from ...errors import InterpError, ModelLoadError
from ..weights.hf_config import is_hf_folder
from ..weights.hf_folder import hf_classifier
from ...paths import check_input_path
from .heads import head_output_width, pooled_width

FORMAT_VERSION = 1
KINDS = ("zeroshot", "linear", "dinov2_linear")
INPUTS = ("pooled", "head_output")
HOOK_POOLED, HOOK_HEAD = "hook_pooled", "hook_logits"
BLOCK_OUTPUTS = "blocks.*.hook_resid_post"  # resolved by the model: its blocks' outputs, in order
RELEASED_DINOV2_SOURCE = "DINOv2 released linear head (plain state dict)"  # the source such a file is read with
_MAKE_ONE = "make one with `interp classifier zeroshot` or interp.models.classifiers.classifier.save_classifier"


class ClassifierError(InterpError):
    """A classifier file that cannot be read, or does not fit the model."""


@dataclass(frozen=True)
class Classifier:
    """A classifier read from a file (module doc), applied to a forward's kept values.

    Attributes:
        kind: "zeroshot" | "linear" | "dinov2_linear"; weight [C, D]; bias [C] or None.
        logit_scale: zeroshot's multiplier. n_blocks, avgpool: dinov2_linear's input (n_blocks None until
            :meth:`bind` infers it from the width of a released head).
        input: what a linear head reads ("pooled" | "head_output"; None until :meth:`bind` decides it by D).
        path: the file it was read from (None for a dict). bound_to: the model :meth:`bind` checked it for.
    """

    kind: str
    weight: torch.Tensor
    bias: Optional[torch.Tensor] = None
    logit_scale: Optional[float] = None
    n_blocks: Optional[int] = None
    avgpool: bool = True
    input: Optional[str] = None
    class_names: Optional[List[str]] = None
    model: Optional[str] = None
    source: Optional[str] = None
    path: Optional[str] = None
    bound_to: Optional[str] = field(default=None, compare=False)
    _hooks: tuple = field(default=(), compare=False, repr=False)

    @property
    def n_classes(self) -> int:
        return int(self.weight.shape[0])

    @property
    def dim(self) -> int:
        return int(self.weight.shape[1])

    @cached_property  # read by every baseline check and record; bind() makes a new object, so it stays right
    def fingerprint(self) -> str:
        """16 hex digits of a hash of the kind, its settings and the weight/bias values."""
        h = hashlib.sha256(f"{self.kind}:{self.logit_scale}:{self.n_blocks}:{self.avgpool}".encode())
        for t in (self.weight, self.bias):
            if t is not None:
                h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def _name(self) -> str:
        return f"classifier {self.path!r}" if self.path else "the classifier"

    # ------------------------------------------------------------------ binding to a model
    def bind(self, model) -> "Classifier":
        """This classifier checked against ``model`` (a ``HookedViT``): its width D, the linear input and
        dinov2's ``n_blocks`` decided; raises :class:`ClassifierError` naming both widths when D does not fit."""
        name, d = model.model_name, self.dim
        if self.kind == "zeroshot":
            width = head_output_width(model)
            if d != width:
                raise ClassifierError(f"{self._name()} has D={d} but {name} outputs {width}-d embeddings (its head "
                                      "output): build the zero-shot matrix with this model's text tower")
            return self._bound(model, [HOOK_HEAD])
        if self.kind == "linear":
            pooled, head = pooled_width(model), head_output_width(model)
            chosen = self.input or ("pooled" if d == pooled else "head_output" if d == head else None)
            width = pooled if chosen == "pooled" else head
            if chosen is None or d != width:
                raise ClassifierError(f"{self._name()} has D={d} but {name}'s pooled vector is {pooled}-d and its "
                                      f"head output {head}-d: train the linear head on this model's features")
            return replace(self._bound(model, [HOOK_POOLED if chosen == "pooled" else HOOK_HEAD]), input=chosen)
        width = int(model.d_model)
        if model.layout.cls_index is None:
            raise ClassifierError(f"{self._name()} is a DINOv2 linear head, which reads class tokens; {name} has "
                                  "no CLS token")
        n_blocks = self.n_blocks
        if n_blocks is None:  # a released head: always with avgpool, n_blocks from the width
            n_blocks = {2 * width: 1, 5 * width: 4}.get(d)
            if n_blocks is None:
                raise ClassifierError(f"{self._name()} (a DINOv2 released linear head) has D={d} but {name} gives "
                                      f"{2 * width} (1 block) or {5 * width} (4 blocks): use the head made for "
                                      "this model size")
        expected = (n_blocks + int(self.avgpool)) * width
        if d != expected:
            raise ClassifierError(f"{self._name()} has D={d} but {name} gives {expected} for n_blocks={n_blocks}, "
                                  f"avgpool={self.avgpool} (width {width}): use the head made for this model")
        if n_blocks > model.n_layers:
            raise ClassifierError(f"{self._name()} reads the last {n_blocks} blocks; {name} has {model.n_layers}")
        blocks = model.resolve_hooks(BLOCK_OUTPUTS)[-n_blocks:]
        return replace(self._bound(model, blocks), n_blocks=n_blocks)

    def _bound(self, model, hooks: List[str]) -> "Classifier":
        return replace(self, bound_to=str(model.model_name), _hooks=tuple(hooks))

    def _check_bound(self) -> None:
        if not self._hooks:
            raise ClassifierError(f"{self._name()} is not bound to a model: call .bind(model) first")

    def hooks(self) -> List[str]:
        """The hooks this (bound) classifier reads."""
        self._check_bound()
        return list(self._hooks)

    def reducers(self, model, layout) -> Dict[str, callable]:
        """hook -> reduction applied inside the hook (so only [b, D]-size values are kept). ``layout``: the
        token layout of this forward (test-time registers stay out of dinov2's patch mean)."""
        self._check_bound()
        if self.kind != "dinov2_linear":
            return {}
        norm, cls, patches = model.timm_model.norm, layout.cls_index, layout.patch_slice

        def cls_and_patch_mean(t: torch.Tensor) -> torch.Tensor:  # [b, t, d] -> [b, 2d]
            normed = norm(t)
            return torch.cat([normed[:, cls], normed[:, patches].mean(1)], dim=-1)

        return {h: cls_and_patch_mean for h in self._hooks}

    def features(self, kept: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The head's input [b, D] from the kept values of :meth:`hooks` (reduced by :meth:`reducers`)."""
        self._check_bound()
        if self.kind != "dinov2_linear":
            return kept[self._hooks[0]].float()
        halves = [kept[h].float() for h in self._hooks]
        width = halves[0].shape[-1] // 2
        parts = [h[:, :width] for h in halves] + ([halves[-1][:, width:]] if self.avgpool else [])
        return torch.cat(parts, dim=-1)

    def logits(self, kept: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Class logits [b, C] from a forward's kept values (module doc for each kind's arithmetic)."""
        return self.apply(self.features(kept))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits [b, C] of head inputs ``x`` [b, D]."""
        w = self.weight.to(x.device, torch.float32)
        if self.kind == "zeroshot":
            return float(self.logit_scale) * F.normalize(x.float(), dim=-1) @ w.T
        out = x.float() @ w.T
        return out if self.bias is None else out + self.bias.to(x.device, torch.float32)

    # ------------------------------------------------------------------ records and files
    def record(self) -> Dict:
        """What the results record about the classifier used."""
        return {"kind": self.kind, "source": self.source, "path": self.path, "fingerprint": self.fingerprint,
                "n_classes": self.n_classes, "dim": self.dim, "input": self._input_name(),
                "n_blocks": self.n_blocks, "avgpool": self.avgpool if self.kind == "dinov2_linear" else None,
                "logit_scale": self.logit_scale, "model": self.model}

    def _input_name(self) -> Optional[str]:
        if self.kind == "zeroshot":
            return "head_output"
        return "last-block tokens" if self.kind == "dinov2_linear" else self.input

    def to_dict(self) -> Dict:
        """The file's dict (``torch.save`` it, or use :meth:`save`)."""
        out = {"interp_classifier": FORMAT_VERSION, "kind": self.kind, "weight": self.weight.detach().cpu()}
        optional = {"bias": None if self.bias is None else self.bias.detach().cpu(), "logit_scale": self.logit_scale,
                    "n_blocks": self.n_blocks, "input": self.input, "class_names": self.class_names,
                    "model": self.model, "source": self.source}
        if self.kind == "dinov2_linear":
            optional["avgpool"] = bool(self.avgpool)
        return {**out, **{k: v for k, v in optional.items() if v is not None}}

    def save(self, path: Union[str, Path]) -> Path:
        """Write the file through a temporary file renamed into place (a crash leaves no half-written file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        try:
            torch.save(self.to_dict(), tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path


def save_classifier(path: Union[str, Path], kind: str, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                    **fields) -> Path:
    """Check and write a classifier file (module doc for ``kind`` and ``fields``: ``logit_scale``,
    ``n_blocks``, ``avgpool``, ``input``, ``class_names``, ``model``, ``source``); returns the path."""
    data = {"interp_classifier": FORMAT_VERSION, "kind": kind, "weight": weight, "bias": bias, **fields}
    return load_classifier({k: v for k, v in data.items() if v is not None}).save(path)


def load_classifier(spec: Union[str, Path, Mapping, Classifier]) -> Classifier:
    """A :class:`Classifier` from a file path, a file's dict, a Classifier (returned as it is), or a ``transformers``
    ``Dinov2(WithRegisters)ForImageClassification`` folder (its head as a ``dinov2_linear`` file,
    :func:`~interp.models.weights.hf_folder.hf_classifier`).

    Raises :class:`ClassifierError` in one line naming the fix: a missing or unreadable file, a dict that is
    not a classifier file, an unknown kind, wrong shapes, NaN/inf values.
    """
    if isinstance(spec, Classifier):
        return spec
    path = None
    if isinstance(spec, (str, Path)):
        path = str(spec)
        check_input_path(path, "classifier file")
        if is_hf_folder(path):  # a transformers Dinov2ForImageClassification: its [CLS, patch mean] head
            try:
                return _from_dict(hf_classifier(path), path)
            except ModelLoadError as e:
                raise ClassifierError(str(e)) from None
        if not Path(path).is_file():
            raise ClassifierError(f"classifier file {path!r} not found: {_MAKE_ONE}")
        try:
            spec = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ClassifierError(f"{path!r} is not a classifier file (torch.load: {str(e).splitlines()[0][:120]}): "
                                  f"{_MAKE_ONE}") from None
    return _from_dict(spec, path)


def _from_dict(data, path: Optional[str]) -> Classifier:
    where = repr(path) if path else "the classifier dict"
    if not isinstance(data, Mapping):
        raise ClassifierError(f"{where} is not a classifier file (it holds a {type(data).__name__}, not a dict): "
                              f"{_MAKE_ONE}")
    if "interp_classifier" not in data:
        if set(data) == {"weight", "bias"}:  # DINOv2's released head: kind and n_blocks from the shapes
            data = {"kind": "dinov2_linear", "weight": data["weight"], "bias": data["bias"], "avgpool": True,
                    "source": RELEASED_DINOV2_SOURCE}
        else:
            raise ClassifierError(f"{where} is not a classifier file (keys {sorted(map(str, data))[:8]}; no "
                                  f"'interp_classifier'): {_MAKE_ONE}")
    elif data["interp_classifier"] != FORMAT_VERSION:
        raise ClassifierError(f"{where} has classifier format {data['interp_classifier']!r}; this interp reads "
                              f"format {FORMAT_VERSION}: rebuild it with this version")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ClassifierError(f"{where} has unknown classifier kind {kind!r}: use one of {list(KINDS)}")
    weight, bias = _tensor(data.get("weight"), "weight", where, 2), _tensor(data.get("bias"), "bias", where, 1)
    if weight is None:
        raise ClassifierError(f"{where} has no 'weight' [C, D] tensor: {_MAKE_ONE}")
    if bias is not None and bias.shape[0] != weight.shape[0]:
        raise ClassifierError(f"{where}: bias has {bias.shape[0]} entries but weight has {weight.shape[0]} classes "
                              "(rows): save matching weight [C, D] and bias [C]")
    if kind == "dinov2_linear" and bias is None:
        raise ClassifierError(f"{where}: a dinov2_linear head needs its 'bias' [C]")
    scale = data.get("logit_scale")
    if kind == "zeroshot":
        scale = _zeroshot_scale(weight, scale, where)
    n_blocks, names = data.get("n_blocks"), data.get("class_names")
    if n_blocks is not None and n_blocks not in (1, 4) and kind == "dinov2_linear":
        raise ClassifierError(f"{where}: n_blocks={n_blocks!r}; the DINOv2 linear heads read the last 1 or 4 blocks")
    if data.get("input") not in (None,) + INPUTS:
        raise ClassifierError(f"{where}: input={data['input']!r}; use one of {list(INPUTS)}")
    if names is not None and len(names) != weight.shape[0]:
        raise ClassifierError(f"{where} names {len(names)} classes but weight has {weight.shape[0]} rows: save one "
                              "name per class")
    return Classifier(kind=kind, weight=weight, bias=bias, logit_scale=scale, n_blocks=n_blocks,
                      avgpool=bool(data.get("avgpool", True)), input=data.get("input"),
                      class_names=None if names is None else [str(n) for n in names], model=data.get("model"),
                      source=data.get("source"), path=path)


def _tensor(value, key: str, where: str, ndim: int) -> Optional[torch.Tensor]:
    if value is None:
        return None
    t = torch.as_tensor(value)
    if t.dim() != ndim or not t.is_floating_point():
        shape = "[C, D]" if ndim == 2 else "[C]"
        raise ClassifierError(f"{where}: '{key}' must be a float tensor {shape}, got {t.dtype} {list(t.shape)}")
    if not torch.isfinite(t).all():
        raise ClassifierError(f"{where}: '{key}' has NaN or infinite values: rebuild the classifier file")
    return t.detach().to(torch.float32).cpu()


def _zeroshot_scale(weight: torch.Tensor, scale, where: str) -> float:
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        scale = float(scale)
    if scale is None or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ClassifierError(f"{where}: a zeroshot classifier needs 'logit_scale', a finite positive number (the "
                              f"multiplier itself, e.g. 100.0 = CLIP's logit_scale.exp()), got {scale!r}")
    norms = weight.norm(dim=-1)
    if (norms - 1).abs().max() > 1e-3:
        raise ClassifierError(f"{where}: zeroshot rows must be L2-normalised class embeddings (row norms "
                              f"{float(norms.min()):.4g}..{float(norms.max()):.4g}): normalise them before saving")
    return float(scale)
