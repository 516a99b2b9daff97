"""Several studies fed from one pass over a source: each study says what it reads from a forward (a
:class:`Fold`: hooks, how each is reduced, what it adds up from each batch) and what it makes of it afterwards
(a :class:`Reading`), so ``interp report`` runs the observational studies (norms, neuron scores, probes,
LOST) on one forward per image instead of one each.

The unedited forwards the causal studies compare with are one pass too (:func:`baseline_pass`).

A study run alone is the same reading over its own pass (``run_readings(source, [reading])``): one code path,
so a study gives the same numbers alone and in the report.

On a live source every fold's hooks come from one :func:`~interp.runtime.forward.run_hooks` call per
batch; two folds of one hook each get it reduced their own way (both reductions run inside the hook, on the
model's own tensor). A cache source is read once per fold (there is no forward to share).

>>> from interp.hooks.names import resid_post
>>> seen = []
>>> norms = Fold([resid_post(5)], lambda b: seen.append(b.acts[resid_post(5)].shape),
...              reduce={resid_post(5): lambda t: t.norm(dim=-1)})
>>> full = Fold([resid_post(5)], lambda b: seen.append(b.acts[resid_post(5)].shape), images=True)
>>> read_pass(source, [norms, full], batch_size=4, progress=False)    # one forward serves both
>>> seen                                                             # [b, t] norms, [b, t, d] tokens
[torch.Size([4, 197]), torch.Size([4, 197, 192])]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from .._progress import tqdm
from ..models.classifiers.classifier import Classifier
from ..models.layout import TokenLayout
from .forward import Baseline, Reducer, Reducers, baseline_summary, resolve_reducers, run_hooks
from .source import ActivationSource, Batch, n_batches


@dataclass
class Fold:
    """What one study adds up from each batch of a pass.

    Attributes:
        hooks: exact hook names it reads.
        add: called with each :class:`~interp.runtime.source.Batch` (its hooks only, reduced its way),
            in image order.
        reduce: hook -> reducer, or ``layout -> {hook: reducer}`` (as in ``source.batches``).
        images: the fold also reads ``batch.images`` (the forward's inputs, float32 CPU [b, 3, H, W]; live
            sources only, None from a cache).
    """

    hooks: Sequence[str]
    add: Callable[[Batch], None]
    reduce: Reducers = None
    images: bool = False

    def reducers(self, layout: TokenLayout) -> Dict[str, Reducer]:
        return resolve_reducers(self.reduce, layout)


@dataclass
class Reading:
    """A study split around its pass: ``folds`` (none when it needs no forward), then ``finish()``, which
    makes its result from what the folds added up."""

    folds: List[Fold] = field(default_factory=list)
    finish: Callable[[], Any] = lambda: None


def _fan_out(folds: Sequence[Fold]) -> Callable[[TokenLayout], Dict[str, Reducer]]:
    """Reducers ``layout -> {hook: fn}`` whose fn returns {fold index: that fold's value of the hook}."""

    def reducers(layout: TokenLayout) -> Dict[str, Reducer]:
        wanted: Dict[str, List] = {}
        for i, fold in enumerate(folds):
            fns = fold.reducers(layout)
            for hook in fold.hooks:
                wanted.setdefault(hook, []).append((i, fns.get(hook)))

        def one(entries):
            return lambda t: {i: t if fn is None else fn(t) for i, fn in entries}

        return {hook: one(entries) for hook, entries in wanted.items()}

    return reducers


def read_pass(source: ActivationSource, folds: Sequence[Fold], batch_size: Optional[int] = None,
              progress: bool = True, desc: str = "pass") -> None:
    """Feed every fold from one pass over ``source`` (one forward per batch on a live source, under the
    source's interventions); memory: one batch of every fold's hooks at a time."""

    folds = [f for f in folds if f.hooks or f.images]
    if not folds:
        return
    bs = batch_size or source.batch_size
    bar = dict(total=n_batches(source, bs), disable=not progress, desc=desc, unit="batch", leave=False)
    if not source.is_live:
        for fold in folds:
            for batch in tqdm(source.batches(list(fold.hooks), bs, reduce=fold.reduce), **bar):
                fold.add(batch)
        return
    model = source.model
    hooks = model.resolve_hooks(list(dict.fromkeys(h for f in folds for h in f.hooks)))
    fan_out = _fan_out(folds)
    for start, x in tqdm(source.image_batches(bs), **bar):
        run = run_hooks(model, x, hooks, fan_out, source.interventions)
        ids = source.ids[start:start + len(x)]
        pixels = x.detach().float().cpu() if any(f.images for f in folds) else None
        for i, fold in enumerate(folds):
            acts = {h: run.acts[h][i] for h in fold.hooks}
            fold.add(Batch(ids, start, acts, run.layout, images=pixels if fold.images else None,
                           blocks=source.blocks))


def run_readings(source: ActivationSource, readings: Sequence[Reading], batch_size: Optional[int] = None,
                 progress: bool = True, desc: str = "pass") -> List[Any]:
    """One pass feeding every reading's folds, then each reading's result, in order."""
    read_pass(source, [f for reading in readings for f in reading.folds], batch_size, progress, desc)
    return [reading.finish() for reading in readings]


def baseline_pass(source, layer: int, batch_size: Optional[int] = None, progress: bool = True,
                  classifier: Optional[Classifier] = None, norm_hooks: Sequence[str] = ()) -> Baseline:
    """One unedited forward per image of a live ``source``: logits (``classifier``'s class logits when given),
    the pooled vector, block ``layer``'s patch norms and the last block's CLS->patch attention (what the causal
    studies compare their edited runs with); the token norms at ``norm_hooks`` too (``Baseline.norms``)."""
    model = source.model
    last = model.n_layers - 1
    bs = batch_size or source.batch_size
    classifier = classifier.bind(model) if classifier is not None and classifier.bound_to is None else classifier
    parts = [baseline_summary(model, x, source.interventions, layer, classifier, norm_hooks)
             for _, x in tqdm(source.image_batches(bs), disable=not progress, desc="baseline", unit="batch",
                              total=n_batches(source, bs), leave=False)]
    if not parts:
        raise ValueError("baseline_pass needs at least one image")
    attn = torch.cat([p.cls_attention[last] for p in parts]) if last in parts[0].cls_attention else None
    own = model.block_names.resid_post(layer)
    norms = {h: torch.cat([p.token_norms if h == own else p.acts[h] for p in parts]) for h in norm_hooks}
    return Baseline(layer, last, torch.cat([p.logits for p in parts]), torch.cat([p.patch_norms for p in parts]),
                    attn, tuple(source.ids), source.fingerprint, torch.cat([p.pooled for p in parts]),
                    None if classifier is None else classifier.fingerprint, norms)
