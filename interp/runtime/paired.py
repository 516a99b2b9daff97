"""The edited-pass primitive of the causal studies: per batch of a live source, its unedited forward and one
forward per edited condition, on the same images, paired.

A causal study (ablation, test-time register, relocation, masking, selective CLS) says what it edits, one
:class:`Condition` per edited run (interventions after the source's own, and/or an edit of the input images),
and reads each batch's :class:`Pair`: the unedited :class:`~interp.runtime.forward.ForwardSummary` (made here,
or the rows of a shared :class:`~interp.runtime.forward.Baseline`) beside one summary per condition. The studies
never run the model themselves: the device, the stop layer, the layout of each edited run and the shared
baseline are decided here.

>>> from interp.interventions import NeuronAblation
>>> conditions = {"ablated": Condition([NeuronAblation({2: [17, 101, 402, 655]})])}
>>> pair = next(paired_pass(source, conditions, detect_layer=-1, progress=False))
>>> pair.baseline.patch_norms.shape, pair.edited["ablated"].patch_norms.shape    # [b, P] each
(torch.Size([4, 196]), torch.Size([4, 196]))
>>> bool(pair.edited["ablated"].patch_norms.max() < pair.baseline.patch_norms.max())   # the outliers are gone
True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence, Union

import torch

from .._progress import tqdm
from ..errors import InterpError
from ..models.classifiers.classifier import Classifier
from .forward import Baseline, ForwardSummary, Reducers, baseline_summary, forward_summary
from .source import ActivationSource, n_batches, require_live

ImageEdit = Callable[[int, torch.Tensor], torch.Tensor]  # (first image index, images [b, 3, H, W]) -> edited


@dataclass(frozen=True)
class Condition:
    """One edited forward of a causal study.

    Attributes:
        interventions: applied after the source's own.
        images: an edit of the input batch, ``(start, x [b, 3, H, W]) -> x'`` of the same shape (masking); None:
            the images as they are.
        hooks: more hooks to keep from this forward, reduced by ``reduce`` (hook -> fn, or layout -> {hook: fn}).
        attention_layers: blocks whose CLS attention row (head mean) this forward keeps.
    """

    interventions: Sequence = ()
    images: Optional[ImageEdit] = None
    hooks: Sequence[str] = ()
    reduce: Reducers = None
    attention_layers: Sequence[int] = ()


@dataclass
class Pair:
    """One batch of a paired pass: images ``start .. start + len(images)`` of the source.

    Attributes:
        images: the unedited inputs [b, 3, H, W] (on the model's device).
        baseline: the unedited forward (None when the pass was asked for none).
        edited: condition name -> its forward.
    """

    start: int
    images: torch.Tensor
    baseline: Optional[ForwardSummary]
    edited: Dict[str, ForwardSummary] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.images.shape[0])


def paired_pass(source: ActivationSource, conditions: Mapping[str, Condition], *, detect_layer: Optional[int],
                classifier: Optional[Classifier] = None, baseline: Union[Baseline, bool] = True,
                batch_size: Optional[int] = None, progress: bool = True, desc: str = "edited runs") -> Iterator[Pair]:
    """Per batch of the live ``source``: its unedited forward and one forward per condition, paired.

    Args:
        conditions: name -> :class:`Condition`, run in this order on every batch.
        detect_layer: the block whose output's token norms every summary carries (``patch_norms``); None: none
            (then no unedited forward of the shared baseline's kind: ``baseline`` must be False).
        classifier: the readout whose class logits every summary carries (bound to the model here).
        baseline: True (an unedited forward per batch, as :func:`~interp.runtime.passes.baseline_pass` makes
            it: the last block's CLS attention included), a shared :class:`~interp.runtime.forward.Baseline` made on this source (its rows, no forward),
            or False (no unedited summary).
        batch_size: images per forward (default the source's).
    """
    require_live(source, desc)
    model = source.model
    if classifier is not None and classifier.bound_to is None:
        classifier = classifier.bind(model)
    if detect_layer is None and baseline is not False:
        raise InterpError("an unedited summary reads the detection block: give detect_layer, or baseline=False")
    if isinstance(baseline, Baseline):
        baseline.check(source, model.block_names.index(detect_layer), classifier)
    bs = batch_size or source.batch_size
    own = tuple(source.interventions)
    for start, x in tqdm(source.image_batches(bs), disable=not progress, desc=desc, unit="batch",
                         total=n_batches(source, bs), leave=False):
        if isinstance(baseline, Baseline):
            base = baseline.rows(start, len(x))
        elif baseline:
            base = baseline_summary(model, x, own, detect_layer, classifier)
        else:
            base = None
        edited = {}
        for name, c in conditions.items():
            inputs = x if c.images is None else c.images(start, x)
            if inputs.shape != x.shape:
                raise InterpError(f"condition {name!r} edits the images into shape {tuple(inputs.shape)}; an image "
                                  f"edit keeps the batch's shape {tuple(x.shape)}")
            edited[name] = forward_summary(model, inputs, own + tuple(c.interventions), detect_layer,
                                           c.attention_layers, classifier, c.hooks, c.reduce)
        yield Pair(start, x, base, edited)
