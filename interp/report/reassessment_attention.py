"""Claim 5's attention figure for a model without a CLS token (Baxevanakis et al. 2026): the **mean attention
each patch token receives** at the last block, averaged over heads and over the queries that can attend to it
(``Family.received_attention``: every token in a plain ViT and PVTv2's last stage, the token's window in Swin-v2),
whose share on the high-norm patches the reassessment reports where a model with CLS has the CLS row's.

>>> got, why = received_attention(source)          # doctest: +SKIP
>>> got.shape                                      # doctest: +SKIP
torch.Size([16, 4])
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..errors import InterpError


def received_attention(source, progress: bool = False) -> Tuple[Optional[torch.Tensor], Optional[str]]:
    """(Tensor[N, P] the mean attention each patch token of the last block's grid receives, None) over a live
    ``source``'s images, or (None, why it is not defined: keys pooled by a spatial reduction)."""
    last = source.n_layers - 1
    hook = source.blocks.attn_pattern(last)
    family, size = source.model.family, tuple(source.image_size)
    patches = source.layout_of(hook).patch_slice
    try:
        parts = [b.acts[hook][:, patches] for b in source.batches(
            [hook], source.batch_size, reduce={hook: lambda t: family.received_attention(last, t, size)})]
    except InterpError as e:
        return None, f"no received attention per token: {e}"
    return torch.cat(parts), None
