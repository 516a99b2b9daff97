"""SINDER's singular-defect direction (Wang et al., "SINDER: Repairing the Singular Defects of DINOv2", ECCV 2024;
code ``haoqiwang/sinder``, ``sinder/singular_defect.py``, commit d5f13fa7): the direction the artifacts take,
predicted from the weights alone.

Each block is linearised with the attention taken as the identity mixing of tokens and LayerNorm as its centring
and weight (the 1/std scale dropped: only a direction is sought):

* attention branch: ``A = I + diag(ls1) W_proj W_v diag(norm1.weight) C`` (``W_v``: the value rows of ``qkv``,
  ``C = I - 11^T/d`` the centring);
* MLP branch: ``M = I + diag(ls2) W_fc2 B diag(norm2.weight) C``, ``B`` the least-squares linear fit (no intercept)
  of the MLP's hidden activation (the input of ``fc2``) on ``samples`` standard normal inputs;
* the block: ``M A``; the direction after block ``i``: the top left singular vector of ``(M A)_i ... (M A)_0``.

Where interp differs from the reference: the reference reads DINOv2-giant blocks (LayerScale, a SwiGLU MLP
``w12``/``w3``); interp reads any plain pre-norm block (ViT, EVA), a missing LayerScale is a gain of 1 and the
hidden activation is whatever the MLP feeds ``fc2`` (GELU, SwiGLU...). The fit is solved through the normal equations
in float64 with the hidden activations computed in chunks (the reference: ``torch.linalg.lstsq`` on all samples at
once): the same fit to float error, in less memory. A singular vector's sign is arbitrary: compare by ``|cos|``.

>>> directions = singular_defect_directions(model, samples=4096, seed=0)   # [L, d] one unit direction per block
>>> directions.shape
torch.Size([6, 192])
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ...errors import InterpError

CHUNK = 8192  # samples whose hidden activations are computed at once


def _gain(gain: Optional[torch.Tensor], d: int) -> torch.Tensor:
    """A LayerScale [d] as float64 (ones where the block has none)."""
    return torch.ones(d, dtype=torch.float64) if gain is None else gain.detach().double().cpu()


def _norm_weight(norm, block: int, which: str) -> torch.Tensor:
    if not isinstance(norm, nn.LayerNorm) or norm.weight is None:
        raise InterpError(f"SINDER reads LayerNorm blocks: block {block}'s {which} is {type(norm).__name__}")
    return norm.weight.detach().double().cpu()


def centring(d: int) -> torch.Tensor:
    """``I - 11^T / d``: LayerNorm's mean subtraction as a matrix [d, d] (float64)."""
    return torch.eye(d, dtype=torch.float64) - torch.full((d, d), 1.0 / d, dtype=torch.float64)


def attention_map(model, layer: int) -> torch.Tensor:
    """[d, d] the attention branch of block ``layer`` linearised, the residual included (module doc)."""
    family = model.family
    if family.attn_head_norm(layer) is not None:
        raise InterpError(f"SINDER: block {layer}'s attention normalises its output before proj")
    w = _norm_weight(family.attn_norm(layer), layer, "attention norm")
    d = w.shape[0]
    gain = _gain(family.attn_gain(layer), d)
    proj = family.attn_out_proj(layer).weight.detach().double().cpu()
    value = family.attn_in_proj(layer).v_weight.detach().double().cpu()
    return torch.eye(d, dtype=torch.float64) + gain[:, None] * (proj @ value) * w[None] @ centring(d)


@torch.no_grad()
def mlp_fit(mlp: nn.Module, out_proj: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """[d_hidden, d] the least-squares linear map (no intercept) from inputs ``x`` [S, d] to the hidden activation
    ``mlp`` feeds its output linear ``out_proj``, by the normal equations in float64, the activations computed
    ``CHUNK`` at a time."""
    hidden = []
    handle = out_proj.register_forward_pre_hook(lambda module, args: hidden.append(args[0].detach()))
    try:
        xtx = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
        xth: Optional[torch.Tensor] = None
        dtype = out_proj.weight.dtype
        device = out_proj.weight.device
        for chunk in x.split(CHUNK):
            hidden.clear()
            mlp(chunk.to(device=device, dtype=dtype).unsqueeze(0))
            h = hidden[0].reshape(chunk.shape[0], -1).double().cpu()
            c = chunk.double()
            xtx += c.T @ c
            xth = c.T @ h if xth is None else xth + c.T @ h
    finally:
        handle.remove()
    return torch.linalg.solve(xtx, xth).T


def mlp_map(model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """[d, d] the MLP branch of block ``layer`` linearised on samples ``x`` [S, d], the residual included."""
    family = model.family
    if family.write_norms(layer) != (None, None):
        raise InterpError(f"SINDER: block {layer} has a norm between its MLP neurons and the residual")
    w = _norm_weight(family.mlp_norm(layer), layer, "MLP norm")
    d = w.shape[0]
    gain = _gain(family.mlp_gain(layer), d)
    out_proj = family.mlp_out_proj(layer)
    fit = mlp_fit(family.mlp(layer), out_proj, x)
    return torch.eye(d, dtype=torch.float64) + gain[:, None] * (out_proj.weight.detach().double().cpu() @ fit) \
        * w[None] @ centring(d)


def singular_defect_directions(model, samples: int = 100_000, seed: int = 0) -> torch.Tensor:
    """[L, d] float32: per block, the unit singular-defect direction of the blocks up to it (module doc).

    Args:
        model: a ``HookedViT`` of plain pre-norm blocks with one residual width (ViT, EVA; not a pyramid).
        samples: standard normal inputs the MLP fit uses per block (the reference: 100,000), drawn from a
            generator seeded with ``seed``, block after block.

    Raises:
        InterpError: a block SINDER's linearisation does not describe (module doc).
    """
    if model.base_layout.stage_grids:
        raise InterpError("SINDER needs one residual width: a pyramid's stages change it")
    generator = torch.Generator().manual_seed(int(seed))
    d = model.d_model
    product = torch.eye(d, dtype=torch.float64)
    out = []
    for layer in range(model.n_layers):
        a = attention_map(model, layer)
        m = mlp_map(model, layer, torch.randn(int(samples), d, generator=generator))
        product = m @ a @ product
        u, _, _ = torch.linalg.svd(product)
        out.append(u[:, 0])
    return torch.stack(out).float()
