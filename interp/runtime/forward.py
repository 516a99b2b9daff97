"""The one forward primitive of the studies: run a live model on a batch under given interventions and keep
only what was asked for (reduced hook values, logits), with the layout of that very forward.

Everything a study, a live source or the report needs from a forward goes through :func:`run_hooks`, so
the device/dtype move, the stop layer and the token layout are decided in one place:

* the layout comes from the input size and the edits in force (``run_layout``), never from a model
  attribute remembered from an earlier forward;
* the forward stops after the last block a hook needs, unless logits are asked for;
* interventions are explicit: they are applied for this forward only (``model.intervene``) and undone;
* with a classifier file (:mod:`interp.models.classifiers.classifier`) the logits are its class logits, not the head's
  output; whenever logits are asked for, the pooled vector ``hook_pooled`` [b, d'] is kept too (the
  representation metrics of :mod:`interp.studies.core.behaviour`).

>>> from interp.interventions import NeuronAblation, TestTimeRegister
>>> run = run_hooks(model, images, ["blocks.3.hook_resid_post"], interventions=[TestTimeRegister({2: [17]})])
>>> run.acts["blocks.3.hook_resid_post"][:, run.layout.patch_slice].shape   # [b, P, d]: patches of this run
torch.Size([4, 196, 192])
>>> out = forward_summary(model, images, [NeuronAblation({2: [17]})], detect_layer=2, attention_layers=[3])
>>> out.logits.shape, out.patch_norms.shape, out.cls_attention[3].shape      # [b, c], [b, P], [b, P]
(torch.Size([4, 10]), torch.Size([4, 196]), torch.Size([4, 196]))

(Named ``forward``, not ``probe``: the linear-probe study is ``linear_probe.py``.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..errors import InterpError
from ..models.classifiers.classifier import HOOK_POOLED, Classifier
from ..models.layout import TokenLayout

Reducer = Callable[[torch.Tensor], torch.Tensor]
# hook -> reducer, or a function of the run's layout giving them (for reducers that slice the token axis)
Reducers = Union[Mapping[str, Reducer], Callable[[TokenLayout], Mapping[str, Reducer]], None]


def resolve_reducers(reduce: Reducers, layout: TokenLayout) -> Dict[str, Reducer]:
    """The {hook: reducer} of ``reduce`` for a forward of ``layout`` (a mapping, a function of the layout, or
    None)."""
    return dict((reduce(layout) if callable(reduce) else reduce) or {})


def run_layout(model, img_size: Tuple[int, int], interventions: Sequence = ()) -> TokenLayout:
    """Token layout of a forward of ``model`` on ``img_size`` inputs under ``interventions`` (and whatever
    the model has active already): read from the input size and the edit state, no forward is run."""
    if not interventions:
        return model.layout_for(tuple(img_size))
    with model.intervene(*interventions):
        return model.layout_for(tuple(img_size))


@dataclass
class Run:
    """What one forward kept.

    Attributes:
        acts: hook -> float32 CPU tensor [b, ...] (reduced when a reducer was given).
        layout: token layout of this forward (its input size and edits).
        logits: [b, C] float32 CPU when asked for (a classifier's class logits when one was given, else the
            head's output), else None.
        pooled: the pooled vector ``hook_pooled`` [b, d'] float32 CPU whenever logits are, else None.
    """

    acts: Dict[str, torch.Tensor]
    layout: TokenLayout
    logits: Optional[torch.Tensor] = None
    pooled: Optional[torch.Tensor] = None


def model_input(model, x: torch.Tensor) -> torch.Tensor:
    """``x`` on the model's device and in its dtype."""
    p = next(model.parameters())
    return x.to(device=p.device, dtype=p.dtype)


def _kept(value):
    """A float32 CPU copy of what a hook keeps: a tensor, or {key: tensor} (several reductions of one hook)."""
    if isinstance(value, dict):
        return {k: _kept(v) for k, v in value.items()}
    return value.detach().float().cpu()


@torch.no_grad()
def run_hooks(model, x: torch.Tensor, hooks: Sequence[str] = (), reduce: Reducers = None,
              interventions: Sequence = (), logits: bool = False, classifier: Optional[Classifier] = None) -> Run:
    """One forward of ``model`` on images ``x`` [b, 3, H, W] under ``interventions``.

    Args:
        hooks: exact hook names to keep.
        reduce: hook -> function applied to the activation inside the hook (so the full tensor is never
            held), or a function ``layout -> {hook: fn}`` for reducers that slice tokens with this run's layout.
            A function may return a dict of tensors (several reductions of one hook; ``passes.read_pass``).
        logits: also return the logits and the pooled vector (runs the whole model; otherwise it stops after
            the last needed block).
        classifier: a classifier (:func:`interp.load_classifier`; bound to ``model`` here if it is not yet):
            ``run.logits`` are its class logits [b, C]. Implies ``logits``.
    """
    hooks = list(dict.fromkeys(hooks))
    x = model_input(model, x)
    logits = logits or classifier is not None
    if classifier is not None and classifier.bound_to is None:
        classifier = classifier.bind(model)
    kept: Dict[str, torch.Tensor] = {}
    read: Dict[str, torch.Tensor] = {}  # what the readout needs, kept apart from the study's own hooks
    with model.intervene(*interventions):
        layout = model.layout_for(tuple(x.shape[-2:]))
        fns = resolve_reducers(reduce, layout)
        head_fns = classifier.reducers(model, layout) if classifier is not None else {}

        def keep(tensor, hook):
            fn = fns.get(hook.name)
            kept[hook.name] = _kept(fn(tensor) if fn else tensor)

        def keep_readout(tensor, hook):
            fn = head_fns.get(hook.name)
            read[hook.name] = _kept(fn(tensor) if fn else tensor)

        readout = ([HOOK_POOLED] if logits else []) + (classifier.hooks() if classifier is not None else [])
        fwd = [(h, keep) for h in hooks] + [(h, keep_readout) for h in dict.fromkeys(readout)]
        stop = None if logits else model.block_names.blocks_needed(hooks)
        out = model.run_with_hooks(x, fwd_hooks=fwd, stop_at_layer=stop)
    if not logits:
        return Run({h: kept[h] for h in hooks}, layout)
    class_logits = classifier.logits(read) if classifier is not None else out.float().cpu()
    return Run({h: kept[h] for h in hooks}, layout, class_logits, read[HOOK_POOLED])


@dataclass
class ForwardSummary:
    """What the causal studies compare between an unedited and an edited forward of one batch.

    Attributes:
        logits: [b, c] (a classifier's class logits when one was given).
        patch_norms: [b, P] patch-token norms at the detection block's output (None without a detection block).
        cls_attention: {layer: [b, P]} CLS->patch attention (head mean), for the layers asked for.
        pooled: [b, d'] the pooled vector ``hook_pooled``.
        token_norms: [b, t] every token's norm at the detection block's output (prefix rows included).
        cls_rows: {layer: [b, t]} the whole CLS attention row (head mean), prefix columns included.
        acts: the forward's values of the extra hooks asked for (reduced as asked).
        layout: the token layout of this forward (its input size and edits).
    """

    logits: torch.Tensor
    patch_norms: Optional[torch.Tensor]
    cls_attention: Dict[int, torch.Tensor] = field(default_factory=dict)
    pooled: Optional[torch.Tensor] = None
    token_norms: Optional[torch.Tensor] = None
    cls_rows: Dict[int, torch.Tensor] = field(default_factory=dict)
    acts: Dict[str, torch.Tensor] = field(default_factory=dict)
    layout: Optional[TokenLayout] = None


def forward_summary(model, x: torch.Tensor, interventions: Sequence = (), detect_layer: Optional[int] = -1,
                    attention_layers: Sequence[int] = (), classifier: Optional[Classifier] = None,
                    hooks: Sequence[str] = (), reduce: Reducers = None) -> ForwardSummary:
    """Logits, detection-layer token norms, CLS attention rows and the pooled vector of one forward of
    ``model`` on ``x`` with ``interventions`` applied; patch slices follow the edited layout. ``classifier``:
    the logits are its class logits. ``hooks``/``reduce``: more hooks to keep from the same forward (the
    detection block's output or an attention pattern among them is kept whole and reduced here too)."""
    names = model.block_names
    norm_hook = None if detect_layer is None else names.resid_post(detect_layer)
    lay = run_layout(model, tuple(x.shape[-2:]), interventions)
    layers = list(attention_layers) if lay.cls_index is not None else []
    patterns = {l: names.attn_pattern(l) for l in layers}
    extra = list(dict.fromkeys(hooks))
    own = ([] if norm_hook is None else [norm_hook]) + list(patterns.values())
    whole = set(extra) & set(own)  # asked for whole too: reduced here from the kept tensor

    def reducers(layout: TokenLayout) -> Dict[str, Reducer]:
        cls = layout.cls_index
        fns = resolve_reducers(reduce, layout)
        if any(h in fns for h in whole):
            raise InterpError(f"forward_summary reduces {sorted(whole)} itself: ask for them without a reducer")
        if norm_hook is not None and norm_hook not in whole:
            fns[norm_hook] = lambda t: t.float().norm(dim=-1)
        fns.update({h: lambda t: t[:, :, cls].float().mean(1) for h in patterns.values() if h not in whole})
        return fns

    run = run_hooks(model, x, list(dict.fromkeys(own + extra)), reducers, interventions, logits=True,
                    classifier=classifier)
    layout = run.layout
    token_norms = None if norm_hook is None else \
        run.acts[norm_hook].norm(dim=-1) if norm_hook in whole else run.acts[norm_hook]
    rows = {l: run.acts[h][:, :, layout.cls_index].mean(1) if h in whole else run.acts[h] for l, h in patterns.items()}
    patch_norms = None if norm_hook is None else token_norms[:, names.layout_of(layout, norm_hook).patch_slice]
    return ForwardSummary(run.logits, patch_norms,
                          {l: r[:, layout.for_block(l).patch_slice] for l, r in rows.items()}, run.pooled,
                          token_norms, rows, {h: run.acts[h] for h in extra}, layout)


@dataclass
class Baseline:
    """The unedited model's forward summary on every image of a source, made once and shared by the causal
    studies (ablate, registers, relocate), whose "before" it is, and by the detection (its norms).

    Attributes:
        layer: the detection block of ``patch_norms``; attention_layer: the block of ``cls_attention``.
        logits [N, c] (the classifier's class logits when made with one); patch_norms [N, P]; cls_attention
        [N, P] (head mean) or None for a model without CLS; pooled [N, d'] (``hook_pooled``).
        ids, fingerprint: the source's images and weights (checked when a study is handed this baseline).
        classifier: the fingerprint of the classifier the logits come from (None: the model's head).
        norms: {hook: [N, t]} every token's norm at more hooks of the same forward (``baseline_pass``'s
            ``norm_hooks``: what a detection that judges every block reads, :mod:`interp.detection.detection`).
    """

    layer: int
    attention_layer: int
    logits: torch.Tensor
    patch_norms: torch.Tensor
    cls_attention: Optional[torch.Tensor]
    ids: Tuple[str, ...]
    fingerprint: str
    pooled: Optional[torch.Tensor] = None
    classifier: Optional[str] = None
    norms: Dict[str, torch.Tensor] = field(default_factory=dict)

    def rows(self, start: int, n: int) -> ForwardSummary:
        """The summary of images ``start .. start + n`` (one batch of the source)."""
        attn = {} if self.cls_attention is None else {self.attention_layer: self.cls_attention[start:start + n]}
        pooled = None if self.pooled is None else self.pooled[start:start + n]
        return ForwardSummary(self.logits[start:start + n], self.patch_norms[start:start + n], attn, pooled)

    def check(self, source, layer: int, classifier: Optional[Classifier] = None) -> "Baseline":
        """This baseline, after checking it was made on ``source`` at detection block ``layer`` with
        ``classifier``."""
        if tuple(source.ids) != self.ids or source.fingerprint != self.fingerprint or layer != self.layer:
            raise InterpError("this baseline was made on other images, weights or detection block than the study "
                              "uses; make it with baseline_pass(source, layer) on the same source")
        if (None if classifier is None else classifier.fingerprint) != self.classifier:
            raise InterpError("this baseline was made with another classifier than the study uses; make it with "
                              "baseline_pass(source, layer, classifier=...) with the same classifier")
        return self


def baseline_summary(model, x: torch.Tensor, interventions: Sequence, layer: int,
                     classifier: Optional[Classifier] = None, norm_hooks: Sequence[str] = ()) -> ForwardSummary:
    """The unedited forward of one batch exactly as :func:`baseline_pass` makes it (the last block's attention
    pattern computed too), so a study without a shared baseline gets the same numbers, to the last bit;
    ``norm_hooks``: more hooks whose token norms [b, t] it keeps (in ``acts``)."""
    own = model.block_names.resid_post(layer)
    extra = [h for h in norm_hooks if h != own]
    return forward_summary(model, x, interventions, layer, attention_layers=[model.n_layers - 1],
                           classifier=classifier, hooks=extra,
                           reduce={h: lambda t: t.float().norm(dim=-1) for h in extra})
