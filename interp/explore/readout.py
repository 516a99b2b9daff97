"""How the explorer reads the model's output against the unedited model, over all loaded images.

A classification head gets top-1 agreement, and accuracy when the images come in an image-folder layout
``DIR/<class>/img`` whose class names are all among the model's own label names (timm's
``pretrained_cfg["label_names"]``), each folder read as the class of that name: a folder's position among its
sorted siblings says nothing about which of the head's outputs it is. A head that is not a classifier (the synthetic ``planted_vit``'s random head, random weights, an
identity head such as DINOv2's, a CLIP image tower's projection) gets the mean cosine similarity of the
pooled vector (``hook_pooled``) to the unedited one instead: an argmax over such a head means nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ..errors import InterpError
from ..models.heads import HEAD_KINDS, classify_head  # noqa: F401  (classify_head: read here too)

HEAD_CHOICES = ("auto",) + HEAD_KINDS


@dataclass
class HeadReadout:
    """``kind`` ("classifier" or "embedding"), ``why``, and the image-folder labels when there are some."""

    kind: str
    why: str
    labels: Optional[List[int]] = None  # the model's class index of each image, when the folders name them
    accuracy_note: Optional[str] = None  # why there is no accuracy although the images have folder labels

    def compare(self, base: Dict[str, torch.Tensor], edited: Dict[str, torch.Tensor]) -> Dict:
        """{"kind", "metric", "value", "n_images", ...} of the edited outputs against the unedited ones.

        ``base``/``edited``: {"pooled": [N, d'], "logits": [N, c]}.
        """
        n = int(base["logits"].shape[0])
        if self.kind == "embedding":
            cos = nn.functional.cosine_similarity(edited["pooled"].double(), base["pooled"].double(), dim=-1)
            return {"kind": "embedding", "metric": "cosine to the unedited pooled vector (mean over images)",
                    "value": float(cos.mean()), "min": float(cos.min()), "n_images": n, "why": self.why}
        top1, base_top1 = edited["logits"].argmax(-1), base["logits"].argmax(-1)
        out = {"kind": "classifier", "metric": "top-1 agreement with the unedited model",
               "value": float((top1 == base_top1).double().mean()), "n_images": n, "why": self.why,
               "accuracy": None, "baseline_accuracy": None, "accuracy_note": self.accuracy_note}
        if self.labels is not None:
            y = torch.tensor(self.labels)
            out["accuracy"] = float((top1 == y).double().mean())
            out["baseline_accuracy"] = float((base_top1 == y).double().mean())
        return out


def model_labels(model, labels: Optional[List[int]], class_names: Sequence[str]) -> tuple:
    """(the model's class index of each image, or None; why not, or None) for folder ``labels`` (indices into the
    sorted folder ``class_names``), matching each folder name to the model's label names (case-insensitive)."""
    if labels is None or not class_names:
        return None, None
    names = (getattr(model.timm_model, "pretrained_cfg", None) or {}).get("label_names") or []
    index = {str(n).strip().lower(): i for i, n in enumerate(names)}
    wanted = [index.get(str(c).strip().lower()) for c in class_names]
    if not names or None in wanted:
        missing = [c for c, i in zip(class_names, wanted) if i is None]
        why = ("the model has no label names" if not names else
               f"{len(missing)} folder(s) name no class of the model, e.g. {missing[0]!r}")
        return None, (f"no accuracy: the folder labels do not name the model's classes ({why}); top-1 agreement "
                      "with the unedited model is shown instead")
    return [wanted[y] for y in labels], None


def head_readout(model, head: str = "auto", random_weights: bool = False, labels: Optional[List[int]] = None,
                 class_names: Sequence[str] = ()) -> HeadReadout:
    """The readout for ``model``: ``head`` "auto" decides with :func:`classify_head`; "classifier" or
    "embedding" forces it. ``labels``/``class_names``: the image-folder labels (indices into the sorted folder
    names), used for accuracy only when the folder names are the model's own label names."""
    if head not in HEAD_CHOICES:
        raise InterpError(f"head {head!r}: use one of {list(HEAD_CHOICES)}")
    if head == "auto":
        kind, why = classify_head(model, random_weights)
    else:
        kind, why = head, f"read as {head} (--head {head})"
    if kind != "classifier":
        return HeadReadout(kind, why)
    return HeadReadout(kind, why, *model_labels(model, labels, class_names))
