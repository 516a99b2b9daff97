"""One forward pass of a live model (with interventions) that keeps only what causal studies compare:
logits, the detection layer's patch-token norms, and CLS->patch attention rows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

import torch

from .outliers import resid_post


@dataclass
class ProbeOutput:
    """logits [b, c]; patch_norms [b, P] at the detection layer; cls_attention {layer: [b, P]} (head mean)."""

    logits: torch.Tensor
    patch_norms: torch.Tensor
    cls_attention: Dict[int, torch.Tensor] = field(default_factory=dict)


@torch.no_grad()
def probe(model, x: torch.Tensor, interventions: Sequence = (), detect_layer: int = -1,
          attention_layers: Sequence[int] = ()) -> ProbeOutput:
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
            hooks += [(f"blocks.{l}.attn.hook_pattern", keep_cls_row) for l in attention_layers]
        logits = model.run_with_hooks(x, fwd_hooks=hooks)
    attn = {l: kept[f"blocks.{l}.attn.hook_pattern"] for l in attention_layers
            if f"blocks.{l}.attn.hook_pattern" in kept}
    return ProbeOutput(logits.float().cpu(), kept[resid_post(detect_layer % model.n_layers)], attn)
