"""The behaviour meter every behaviour study shares (ablate, registers, relocate, masking, selective-cls): what
an edited forward does to the model's output, compared with the unedited forward on the same images.

Per condition, accumulated over batches, one record shape ``{metric: value}`` (:data:`METRICS`):

* ``top1_agreement`` (share of images whose top-1 class is the unedited run's) and ``accuracy`` (share whose
  top-1 is the image's label) ONLY when the logits are class logits: a classifier file
  (:func:`interp.load_classifier`), or a head :func:`~interp.models.heads.classify_head` calls a classifier.
  Otherwise both are None: an argmax over a CLIP projection or an identity head means nothing.
* always the representation metrics of the pooled vector ``hook_pooled``: ``pooled_cosine`` (mean over images
  of its cosine to the unedited one), ``pooled_cosine_min`` and ``pooled_norm`` (mean L2 norm).

:class:`BehaviourReadout` says once (``note``) why there is no agreement or accuracy, and ``record()`` is what
a result stores about the classifier used.

Labels: from an image-folder layout ``DIR/<class>/img``. With a classifier file that names its classes, a
folder is the class of that name (case-insensitive; "_" read as " "); otherwise folder names that are integers
are class indices, else the sorted folder index is used (right when the folders are the full class list, e.g.
ImageNet's synset folders; with a classifier file only when there are as many folders as classes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ...models.classifier import Classifier, load_classifier
from ...models.heads import classify_head, head_output_width

METRICS = ("top1_agreement", "accuracy", "pooled_cosine", "pooled_cosine_min", "pooled_norm")
ClassifierLike = Union[None, str, Classifier, dict]


def _norm_name(name: str) -> str:
    return str(name).strip().lower().replace("_", " ")


def target_classes(source, class_names: Optional[Sequence[str]] = None) -> Optional[torch.Tensor]:
    """The class index [N] of each image of ``source`` from its image-folder layout, or None without labels or
    when the folders do not name ``class_names`` (the classifier's classes; module doc)."""
    labels = source.labels
    if labels is None:
        return None
    names = list(source.class_names)
    if class_names:
        index = {_norm_name(n): i for i, n in enumerate(class_names)}
        wanted = [index.get(_norm_name(n)) for n in names]
        if names and None not in wanted:
            return torch.tensor([wanted[label] for label in labels])
    if names and all(n.isdigit() for n in names):
        return torch.tensor([int(names[label]) for label in labels])
    return None if class_names and len(names) != len(class_names) else torch.tensor(labels)


@dataclass(frozen=True)
class BehaviourReadout:
    """How a study reads behaviour on one source: decided once.

    Attributes:
        classifier: the classifier file bound to the model, or None (the model's own head).
        classes: True when the logits are class logits (agreement and accuracy mean something).
        why: what the head or classifier is. labels: [N] class index per image, or None.
        note: why there is no agreement or no accuracy (None when both exist).
    """

    classifier: Optional[Classifier]
    classes: bool
    why: str
    labels: Optional[torch.Tensor]
    note: Optional[str]
    model: str = ""
    head_width: int = 0

    def record(self) -> Dict:
        """Which classifier the results used: a file's kind, source, path, fingerprint and classes, or the
        model's own head."""
        if self.classifier is not None:
            return self.classifier.record()
        return {"kind": "model_head", "source": self.model, "path": None, "fingerprint": None,
                "n_classes": self.head_width if self.classes else None, "head": "classifier" if self.classes
                else "embedding", "why": self.why}


def behaviour_readout(source, classifier: ClassifierLike = None) -> BehaviourReadout:
    """The readout of ``source``'s model: through ``classifier`` (a path, a file's dict or a Classifier) when
    given, else its own head, class logits only when :func:`classify_head` calls it a classifier."""
    model = source.model
    clf = None if classifier is None else load_classifier(classifier).bind(model)
    if clf is not None:
        classes, why = True, f"{clf.kind} classifier ({clf.n_classes} classes{', ' + clf.source if clf.source else ''})"
    else:
        kind, why = classify_head(model)
        classes = kind == "classifier"
    labels = target_classes(source, clf.class_names if clf is not None else None) if classes else None
    note = None
    if not classes:
        note = (f"no top-1 agreement or accuracy: {why}; pass --classifier FILE (classifier= in Python) for class "
                "logits. Reported instead: cosine of the pooled vector to the unedited one, and its norm")
    elif labels is None:
        note = ("no accuracy: the images carry no labels (an image-folder layout DIR/<class>/img gives them)"
                if source.labels is None else "no accuracy: the image folders do not name the classifier's classes")
    return BehaviourReadout(clf, classes, why, labels, note, str(source.model_name), head_output_width(model))


class BehaviourMeter:
    """Accumulates :data:`METRICS` per condition over batches (memory: a few numbers per condition)."""

    def __init__(self, readout: BehaviourReadout):
        self.readout = readout
        self._sums: Dict[str, Dict[str, float]] = {}

    def add(self, name: str, start: int, logits: torch.Tensor, pooled: torch.Tensor, base_logits: torch.Tensor,
            base_pooled: torch.Tensor) -> None:
        """One batch of condition ``name``: images ``start .. start + b`` of the source; ``logits`` [b, C] and
        ``pooled`` [b, d'] of the edited run, ``base_*`` of the unedited run on the same images (``base_logits``
        may be its top-1 classes [b] instead, for a study that keeps only those)."""
        s = self._sums.setdefault(name, {"n": 0, "agree": 0, "correct": 0, "cos": 0.0, "cos_min": float("inf"),
                                         "norm": 0.0})
        b = int(pooled.shape[0])
        cos = F.cosine_similarity(pooled.double(), base_pooled.double(), dim=-1)
        s["n"] += b
        s["cos"] += float(cos.sum())
        s["cos_min"] = min(s["cos_min"], float(cos.min()))
        s["norm"] += float(pooled.double().norm(dim=-1).sum())
        if self.readout.classes:
            top1 = logits.argmax(-1)
            base_top1 = base_logits if base_logits.dim() == 1 else base_logits.argmax(-1)
            s["agree"] += int((top1 == base_top1).sum())
            if self.readout.labels is not None:
                s["correct"] += int((top1 == self.readout.labels[start:start + b]).sum())

    def metrics(self, name: str) -> Dict[str, Optional[float]]:
        """{metric: value} of condition ``name`` (agreement/accuracy None where they mean nothing)."""
        s = self._sums[name]
        n = s["n"]
        classes, labelled = self.readout.classes, self.readout.labels is not None
        return {"top1_agreement": s["agree"] / n if classes else None,
                "accuracy": s["correct"] / n if classes and labelled else None,
                "pooled_cosine": s["cos"] / n, "pooled_cosine_min": s["cos_min"], "pooled_norm": s["norm"] / n}

    def conditions(self) -> Dict[str, Dict[str, Optional[float]]]:
        """{condition: {metric: value}} of every condition added, in the order they were first added."""
        return {name: self.metrics(name) for name in self._sums}


def headline_metric(readout: BehaviourReadout) -> str:
    """The behaviour metric a figure or summary shows: accuracy, else top-1 agreement, else pooled cosine."""
    if readout.classes:
        return "accuracy" if readout.labels is not None else "top1_agreement"
    return "pooled_cosine"
