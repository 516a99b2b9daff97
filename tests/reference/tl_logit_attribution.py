"""TransformerLens's direct logit attribution arithmetic, transcribed as a test oracle (never imported by interp).

Reference: TransformerLensOrg/TransformerLens, ``transformer_lens/ActivationCache.py`` (commit
da3b4e53dbb308345975c6fbb4a17e683b9fd54a): ``decompose_resid`` (the embedding, then each layer's attention and
MLP outputs, stacked on a leading component axis), ``stack_head_results`` (each head's ``z @ W_O[head]``, without
``b_O``), ``apply_ln_to_stack`` (LayerNorm: each component centred on d_model and divided by the final norm's
cached ``hook_scale``, ``sqrt(mean((x - mean x)^2) + eps)`` of the full residual stream, as ``LayerNormPre``
computes it) and ``logit_attrs`` (the normed stack dotted with the unembedding directions of the tokens, the
norm's weight folded into them as ``fold_ln`` does: ``direction = w * W_U[:, c]``). The norm's and the head's
biases are not in any component: with ``fold_ln`` they are ``b_U``'s.

A ViT reads its head from the pooled row: the CLS row ("token" pooling), or the mean of the patch rows ("avg":
each row normed with its own cached scale, then averaged).
"""
from __future__ import annotations

from typing import Dict, List

import torch


def decompose_resid(cache: Dict[str, torch.Tensor], n_layers: int) -> torch.Tensor:
    """[2 n_layers + 1, b, t, d]: ``hook_embed``, then per layer ``hook_attn_out``, ``hook_mlp_out``."""
    parts: List[torch.Tensor] = [cache["hook_embed"]]
    for layer in range(n_layers):
        parts += [cache[f"blocks.{layer}.hook_attn_out"], cache[f"blocks.{layer}.hook_mlp_out"]]
    return torch.stack(parts)


def stack_head_results(z: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """[h, b, t, d]: each head's result ``z[:, :, h] @ W_O[h]`` (W_O [h, dh, d]; LayerScale folded into W_O)."""
    return torch.einsum("bthe,hed->hbtd", z, W_O)


def ln_final_scale(resid: torch.Tensor, eps: float) -> torch.Tensor:
    """``ln_final.hook_scale`` [b, t, 1] of the full residual stream (``LayerNormPre``)."""
    x = resid - resid.mean(-1, keepdim=True)
    return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def apply_ln_to_stack(residual_stack: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Centre each component (LayerNorm) and divide by the cached scale."""
    residual_stack = residual_stack - residual_stack.mean(dim=-1, keepdim=True)
    return residual_stack / scale


def logit_attrs(residual_stack: torch.Tensor, scale: torch.Tensor, direction: torch.Tensor, pool: str,
                n_prefix: int) -> torch.Tensor:
    """[components, b]: each component's attribution to the logit whose folded direction is ``direction`` [d]."""
    normed = apply_ln_to_stack(residual_stack, scale)
    pooled = normed[:, :, 0] if pool == "token" else normed[:, :, n_prefix:].mean(2)
    return (pooled * direction).sum(-1)
