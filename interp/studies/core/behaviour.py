"""The behaviour meter every behaviour study shares (ablate, registers, relocate, masking, selective-cls): what
an edited forward does to the model's output, compared with the unedited forward on the same images.

Per condition, accumulated over batches, one record shape ``{metric: value}`` (:data:`METRICS`):

* ``top1_agreement`` (share of images whose top-1 class is the unedited run's) and ``accuracy`` (share whose
  top-1 is the image's label) ONLY when the logits are class logits: a classifier file
  (:func:`interp.load_classifier`), or a head :func:`~interp.models.classifiers.heads.classify_head` calls a classifier.
  Otherwise both are None: an argmax over a CLIP projection or an identity head means nothing.
* always the representation metrics of the pooled vector ``hook_pooled``: ``pooled_cosine`` (mean over images
  of its cosine to the unedited one), ``pooled_cosine_min`` and ``pooled_norm`` (mean L2 norm).

:class:`BehaviourReadout` says once (``note``) why there is no agreement or accuracy, and ``record()`` is what
a result stores about the classifier used.

Labels, one rule (the studies, ``interp report`` and ``interp explore`` all read behaviour here): accuracy only when
the image folders (``DIR/<class>/img``) name the classifier's classes; each folder must name exactly one class,
compared case-insensitively with "_" read as " " (:func:`target_classes`). A folder's position among its sorted
siblings is never a label. The class names (:func:`classifier_class_names`):

* a classifier file: its ``class_names``; a DINOv2 released linear head (plain state dict, 1000 classes): the
  ImageNet-1k classes, in the order the DINOv2 heads were trained on (timm's ``imagenet-1k`` order);
* the model's own classification head: ``pretrained_cfg["label_names"]``, else the ImageNet subset timm infers
  from the number of classes (``timm.data.infer_imagenet_subset``: 1000: ImageNet-1k, 11821: -12k, 21841: -22k,
  21843: Google's -21k);
* an ImageNet class is named by its WordNet synset id (``n01440764``), its full description (``tench, Tinca
  tinca``) or any one of its comma-separated synonyms that no other class uses (``tench``; not ``crane``).

Without a match the readout says why in ``note`` (e.g. "folder names do not match the classifier's class names:
top-1 agreement only"); top-1 agreement with the unedited model needs no labels.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from timm.data import ImageNetInfo, infer_imagenet_subset

from ...models.classifiers.classifier import RELEASED_DINOV2_SOURCE, Classifier, load_classifier
from ...models.classifiers.heads import Head

METRICS = ("top1_agreement", "accuracy", "pooled_cosine", "pooled_cosine_min", "pooled_norm")
ClassifierLike = Union[None, str, Classifier, dict]
ClassNames = Sequence[Union[str, Sequence[str]]]  # per class: a name, or the names a folder may use for it


def _norm_name(name: str) -> str:
    return " ".join(str(name).strip().lower().replace("_", " ").split())


@functools.lru_cache(maxsize=None)
def imagenet_class_names(n_classes: int) -> Optional[Tuple[Tuple[str, ...], ...]]:
    """Per class of timm's ImageNet subset of ``n_classes`` classes (None for another count): its synset id, its
    description and each comma-separated synonym of the description. Read once per process (timm reads the
    subset's files on every call)."""
    subset = infer_imagenet_subset({"num_classes": int(n_classes)})
    if subset is None:
        return None
    info = ImageNetInfo(subset)
    return tuple((synset, text, *(part.strip() for part in text.split(",")))
                 for synset, text in zip(info.label_names(), info.label_descriptions()))


def classifier_class_names(head: Head, classifier: Optional[Classifier]) -> Tuple[Optional[ClassNames], str]:
    """(per class the names a folder may use, or None; where they come from, or why there are none) for
    ``classifier`` or, when None, the model's own ``head`` (module doc)."""
    if classifier is not None:
        if classifier.class_names:
            return list(classifier.class_names), "the classifier file's class_names"
        if classifier.source == RELEASED_DINOV2_SOURCE and classifier.n_classes == 1000:
            return imagenet_class_names(1000), "ImageNet-1k (a DINOv2 released linear head)"
        return None, "the classifier file names no classes (save it with class_names)"
    n, given = head.n_classes, list(head.label_names)
    imagenet = imagenet_class_names(n)
    if given and len(given) == n:
        if imagenet is not None and [c[0] for c in imagenet] == given:
            return imagenet, "the model's ImageNet label names"
        return given, "the model's label names (pretrained_cfg)"
    if imagenet is not None:
        return imagenet, f"the model's head: {n} ImageNet classes (timm's class order)"
    return None, f"the model's head names none of its {n} classes (no label_names)"


def folder_classes(folders: Sequence[str], class_names: ClassNames) -> Tuple[List[Optional[int]], List[str]]:
    """(the class index each folder names, None where it names none or several; the folders naming none)."""
    owners: Dict[str, set] = {}
    for i, names in enumerate(class_names):
        for name in ([names] if isinstance(names, str) else names):
            owners.setdefault(_norm_name(name), set()).add(i)
    wanted = [next(iter(owners[k])) if len(owners.get(k, ())) == 1 else None for k in map(_norm_name, folders)]
    return wanted, [f for f, w in zip(folders, wanted) if w is None]


def target_classes(source, class_names: Optional[ClassNames] = None) -> Optional[torch.Tensor]:
    """The class index [N] of each image of ``source`` from its image-folder layout, or None without labels, or
    unless every folder names one class of ``class_names`` (module doc)."""
    labels, folders = source.labels, list(source.class_names)
    if labels is None or not folders or not class_names:
        return None
    wanted, missing = folder_classes(folders, class_names)
    return None if missing else torch.tensor([wanted[label] for label in labels])


def _accuracy_note(source, class_names: Optional[ClassNames], names_from: str) -> str:
    if source.labels is None or not list(source.class_names):
        return ("no accuracy: the images carry no labels (an image-folder layout DIR/<class>/img gives them): "
                "top-1 agreement only")
    if not class_names:
        return f"no accuracy: {names_from}: top-1 agreement only"
    _, missing = folder_classes(list(source.class_names), class_names)
    return (f"no accuracy: folder names do not match the classifier's class names ({len(missing)} of "
            f"{len(source.class_names)} folders name no single class of {names_from}, e.g. {missing[0]!r}): top-1 "
            "agreement only")


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
    head = source.head()
    clf = None if classifier is None else source.bind_classifier(load_classifier(classifier))
    if clf is not None:
        classes, why = True, f"{clf.kind} classifier ({clf.n_classes} classes{', ' + clf.source if clf.source else ''})"
    else:
        classes, why = head.kind == "classifier", head.why
    labels, note = None, None
    if not classes:
        note = (f"no top-1 agreement or accuracy: {why}; pass --classifier FILE (classifier= in Python) for class "
                "logits. Reported instead: cosine of the pooled vector to the unedited one, and its norm")
    else:
        names, names_from = classifier_class_names(head, clf)
        labels = target_classes(source, names)
        note = None if labels is not None else _accuracy_note(source, names, names_from)
    return BehaviourReadout(clf, classes, why, labels, note, str(source.model_name), head.width)


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
