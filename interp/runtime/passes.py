"""Several studies fed from one pass over a source: each study says what it reads from a forward (a
:class:`Reader`: hooks, how each is reduced, what it does with a batch) and what it makes of it afterwards
(a :class:`Reading`), so ``interp report`` runs the observational studies (norms, neuron scores, probes,
LOST) on one forward per image instead of one each.

The unedited forwards the causal studies compare with are one pass too (:func:`baseline_pass`).

A study run alone is the same reading over its own pass (``run_readings(source, [reading])``): one code path,
so a study gives the same numbers alone and in the report.

On a live source every reader's hooks come from one :func:`~interp.runtime.forward.run_hooks` call per
batch; two readers of one hook each get it reduced their own way (both reductions run inside the hook, on the
model's own tensor). A cache source is read once per reader (there is no forward to share).

>>> from interp.hooks.names import resid_post
>>> seen = []
>>> norms = Reader([resid_post(5)], lambda b: seen.append(b.acts[resid_post(5)].shape),
...                reduce={resid_post(5): lambda t: t.norm(dim=-1)})
>>> full = Reader([resid_post(5)], lambda b: seen.append(b.acts[resid_post(5)].shape), images=True)
>>> read_pass(source, [norms, full], batch_size=4, progress=False)    # one forward serves both
>>> seen                                                             # [b, t] norms, [b, t, d] tokens
[torch.Size([4, 197]), torch.Size([4, 197, 192])]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from .._progress import tqdm
from ..models.classifier import Classifier
from ..models.layout import TokenLayout
from .forward import Baseline, Reducer, Reducers, baseline_summary, resolve_reducers, run_hooks
from .source import ActivationSource, Batch, n_batches


@dataclass
class Reader:
    """What one study reads from each batch of a pass.

    Attributes:
        hooks: exact hook names it reads.
        fold: called with each :class:`~interp.runtime.source.Batch` (its hooks only, reduced its way),
            in image order.
        reduce: hook -> reducer, or ``layout -> {hook: reducer}`` (as in ``source.batches``).
        images: the fold also reads ``batch.images`` (the forward's inputs, float32 CPU [b, 3, H, W]; live
            sources only, None from a cache).
    """

    hooks: Sequence[str]
    fold: Callable[[Batch], None]
    reduce: Reducers = None
    images: bool = False

    def reducers(self, layout: TokenLayout) -> Dict[str, Reducer]:
        return resolve_reducers(self.reduce, layout)


@dataclass
class Reading:
    """A study split around its pass: ``readers`` (none when it needs no forward), then ``finish()``, which
    makes its result from what the readers folded."""

    readers: List[Reader] = field(default_factory=list)
    finish: Callable[[], Any] = lambda: None


def _fan_out(readers: Sequence[Reader]) -> Callable[[TokenLayout], Dict[str, Reducer]]:
    """Reducers ``layout -> {hook: fn}`` whose fn returns {reader index: that reader's value of the hook}."""

    def reducers(layout: TokenLayout) -> Dict[str, Reducer]:
        wanted: Dict[str, List] = {}
        for i, reader in enumerate(readers):
            fns = reader.reducers(layout)
            for hook in reader.hooks:
                wanted.setdefault(hook, []).append((i, fns.get(hook)))

        def one(entries):
            return lambda t: {i: t if fn is None else fn(t) for i, fn in entries}

        return {hook: one(entries) for hook, entries in wanted.items()}

    return reducers


def read_pass(source: ActivationSource, readers: Sequence[Reader], batch_size: Optional[int] = None,
              progress: bool = True, desc: str = "pass") -> None:
    """Feed every reader from one pass over ``source`` (one forward per batch on a live source, under the
    source's interventions); memory: one batch of every reader's hooks at a time."""

    readers = [r for r in readers if r.hooks or r.images]
    if not readers:
        return
    bs = batch_size or source.batch_size
    bar = dict(total=n_batches(source, bs), disable=not progress, desc=desc, unit="batch", leave=False)
    if not source.is_live:
        for reader in readers:
            for batch in tqdm(source.batches(list(reader.hooks), bs, reduce=reader.reduce), **bar):
                reader.fold(batch)
        return
    model = source.model
    hooks = model.resolve_hooks(list(dict.fromkeys(h for r in readers for h in r.hooks)))
    fan_out = _fan_out(readers)
    for start, x in tqdm(source.image_batches(bs), **bar):
        run = run_hooks(model, x, hooks, fan_out, source.interventions)
        ids = source.ids[start:start + len(x)]
        pixels = x.detach().float().cpu() if any(r.images for r in readers) else None
        for i, reader in enumerate(readers):
            acts = {h: run.acts[h][i] for h in reader.hooks}
            reader.fold(Batch(ids, start, acts, run.layout, images=pixels if reader.images else None,
                              blocks=source.blocks))


def run_readings(source: ActivationSource, readings: Sequence[Reading], batch_size: Optional[int] = None,
                 progress: bool = True, desc: str = "pass") -> List[Any]:
    """One pass feeding every reading's readers, then each reading's result, in order."""
    read_pass(source, [r for reading in readings for r in reading.readers], batch_size, progress, desc)
    return [reading.finish() for reading in readings]


def baseline_pass(source, layer: int, batch_size: Optional[int] = None, progress: bool = True,
                  classifier: Optional[Classifier] = None) -> Baseline:
    """One unedited forward per image of a live ``source``: logits (``classifier``'s class logits when given),
    the pooled vector, block ``layer``'s patch norms and the last block's CLS->patch attention (what the causal
    studies compare their edited runs with)."""
    model = source.model
    last = model.n_layers - 1
    bs = batch_size or source.batch_size
    classifier = classifier.bind(model) if classifier is not None and classifier.bound_to is None else classifier
    parts = [baseline_summary(model, x, source.interventions, layer, classifier)
             for _, x in tqdm(source.image_batches(bs), disable=not progress, desc="baseline", unit="batch",
                              total=n_batches(source, bs), leave=False)]
    if not parts:
        raise ValueError("baseline_pass needs at least one image")
    attn = torch.cat([p.cls_attention[last] for p in parts]) if last in parts[0].cls_attention else None
    return Baseline(layer, last, torch.cat([p.logits for p in parts]), torch.cat([p.patch_norms for p in parts]),
                    attn, tuple(source.ids), source.fingerprint, torch.cat([p.pooled for p in parts]),
                    None if classifier is None else classifier.fingerprint)
