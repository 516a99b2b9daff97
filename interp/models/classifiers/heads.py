"""What a timm ViT's head is: a classifier over classes, or an embedding (a CLIP image tower's projection, an
identity head such as DINOv2's ``num_classes=0``, random or planted weights), and the widths a classifier
file must match (:mod:`interp.models.classifiers.classifier`).

An argmax over an embedding means nothing, so the studies report top-1 agreement and accuracy only for a
head :func:`classify_head` calls ``"classifier"`` or through a classifier file; otherwise they report
representation metrics (cosine of the pooled vector to the unedited one, its norm).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from torch import nn

from ..planted import planted_truth

HEAD_KINDS = ("classifier", "embedding")
_FINE_TUNED = ("_ft_", "ft_in", "in1k", "in12k", "in21k", "in22k")


def classify_head(model, random_weights: bool = False) -> Tuple[str, str]:
    """("classifier" | "embedding", why) for a ``HookedViT``'s head.

    ``random_weights``: the caller knows the weights are random (a head of random weights classifies nothing).
    """
    m = model.timm_model
    name = str(model.model_name).lower()
    if planted_truth(model) is not None:
        return "embedding", f"{model.model_name} is synthetic: its head has random weights and classifies nothing"
    if getattr(m, "num_classes", 0) == 0 or isinstance(getattr(m, "head", None), nn.Identity):
        return "embedding", "the model has no classification head (identity head: the output is the pooled vector)"
    if random_weights:
        return "embedding", "random weights: the head classifies nothing"
    if "clip" in name and not any(tag in name for tag in _FINE_TUNED):
        return "embedding", "a CLIP image tower: its head projects into the joint image-text space, not onto classes"
    return "classifier", f"{m.num_classes}-way classification head"


def pooled_width(model) -> int:
    """Width d' of the pooled vector ``hook_pooled`` (what the head reads)."""
    m = model.timm_model
    head = getattr(m, "head", None)
    if isinstance(head, nn.Linear):
        return int(head.in_features)
    return int(getattr(m, "head_hidden_size", None) or m.num_features)


def head_output_width(model) -> int:
    """Width of the head's output ``hook_logits`` (classes, a CLIP projection's D, or d' for an identity head)."""
    head = getattr(model.timm_model, "head", None)
    if isinstance(head, nn.Linear):
        return int(head.out_features)
    return pooled_width(model)


@dataclass(frozen=True)
class Head:
    """What a hooked model's head is, read once from the model (the behaviour readout's facts).

    Attributes:
        kind, why: :func:`classify_head`'s answer.
        width: the width of the head's output ``hook_logits`` (:func:`head_output_width`).
        n_classes: timm's ``num_classes`` (0 for an identity head).
        label_names: ``pretrained_cfg["label_names"]`` (empty when the config names none).
    """

    kind: str
    why: str
    width: int
    n_classes: int
    label_names: Tuple[str, ...]


def read_head(model) -> Head:
    """The :class:`Head` of a ``HookedViT``."""
    m = model.timm_model
    kind, why = classify_head(model)
    return Head(kind, why, head_output_width(model), int(getattr(m, "num_classes", 0) or 0),
                tuple((getattr(m, "pretrained_cfg", None) or {}).get("label_names") or ()))
