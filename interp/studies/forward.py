"""One forward pass of a live model (with interventions) that keeps only what causal studies compare:
logits, the detection layer's patch-token norms, and CLS->patch attention rows.

(Named ``forward``, not ``probe``: it is a forward helper; the linear-probe study is ``linear_probe.py``.)

>>> out = forward_summary(model, x, [NeuronAblation({2: [17]})], detect_layer=2, attention_layers=[3])
>>> out.logits, out.patch_norms, out.cls_attention[3]       # [b, c], [b, P], [b, P]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Sequence

import torch

from ..hooks.names import attn_pattern, resid_post


@dataclass
class ForwardSummary:
    """logits [b, c]; patch_norms [b, P] at the detection layer; cls_attention {layer: [b, P]} (head mean)."""

    logits: torch.Tensor
    patch_norms: torch.Tensor
    cls_attention: Dict[int, torch.Tensor] = field(default_factory=dict)


@torch.no_grad()
def forward_summary(model, x: torch.Tensor, interventions: Sequence = (), detect_layer: int = -1,
                    attention_layers: Sequence[int] = ()) -> ForwardSummary:
    """Run ``model`` on ``x`` with ``interventions`` applied; patch slices follow the edited layout."""
    kept: Dict[str, torch.Tensor] = {}
    with model.intervene(*interventions):
        lay = model.layout_for(tuple(x.shape[-2:]))
        patches = lay.patch_slice

        def keep_norms(t, hook):
            kept[hook.name] = t[:, patches].float().norm(dim=-1).cpu()

        def keep_cls_row(t, hook):
            kept[hook.name] = t[:, :, lay.cls_index, patches].float().mean(1).cpu()

        hooks = [(resid_post(detect_layer % model.n_layers), keep_norms)]
        if lay.cls_index is not None:
            hooks += [(attn_pattern(l), keep_cls_row) for l in attention_layers]
        logits = model.run_with_hooks(x, fwd_hooks=hooks)
    attn = {l: kept[attn_pattern(l)] for l in attention_layers if attn_pattern(l) in kept}
    return ForwardSummary(logits.float().cpu(), kept[resid_post(detect_layer % model.n_layers)], attn)
