"""Oracle: SINDER's singular-defect directions (Wang et al. 2024).

Transcribes ``haoqiwang/sinder`` ``sinder/singular_defect.py`` (commit d5f13fa72634a9e2c8eb94b452f9707c4167f758):
``anomaly_dir_attn`` and ``anomaly_dir_mlp_ls`` with ``identity=True, centered=True, bias=False`` (what
``anomaly_dir`` passes when ``homogeneous=False``), ``anomaly_dir`` and ``singular_defect_directions``, in float32
as the reference runs. The reference reads DINOv2 blocks whose MLP is ``w12`` (packed SwiGLU: ``silu(x1) * x2``)
then ``w3``; a timm block with ``SwiGLUPacked`` holds the same layers as ``mlp.fc1`` / ``mlp.fc2`` (``GluMlp`` with
``gate_last=False``), which is the only renaming here. The random inputs come from the global torch generator, as
in the reference (seed it before calling). Only a test oracle, never imported by ``interp``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _centre(n: int) -> torch.Tensor:
    return torch.eye(n) - torch.ones(n, n) / n


def attention_matrix(blk) -> torch.Tensor:
    """``anomaly_dir_attn(blk, identity=True, centered=True)``'s matrix A."""
    n = blk.ls1.gamma.shape[0]
    value = blk.attn.qkv.weight.chunk(3, dim=0)[-1]
    a = torch.diag(blk.ls1.gamma) @ blk.attn.proj.weight @ value @ torch.diag(blk.norm1.weight)
    a = a @ _centre(n)
    return a + torch.eye(n)


def hidden(blk, x: torch.Tensor) -> torch.Tensor:
    """The reference's ``w12``: the packed first layer, ``silu(x1) * x2``."""
    x1, x2 = blk.mlp.fc1(x).chunk(2, dim=-1)
    return F.silu(x1) * x2


def mlp_matrix(blk, samples: int) -> torch.Tensor:
    """``anomaly_dir_mlp_ls(blk, identity=True, centered=True, bias_ls=False)``'s matrix: a least-squares fit (no
    intercept) of the hidden layer on ``samples`` standard normal inputs from the global generator."""
    n = blk.ls2.gamma.shape[0]
    x = torch.randn(samples, n)
    fit = torch.linalg.lstsq(x, hidden(blk, x)).solution.T
    a = torch.diag(blk.ls2.gamma) @ blk.mlp.fc2.weight @ fit @ torch.diag(blk.norm2.weight)
    a = a @ _centre(n)
    return a + torch.eye(n)


@torch.no_grad()
def singular_defect_directions(model, samples: int = 100_000):
    """Per block, the top left singular vector of the product of the blocks' ``C @ A`` up to it."""
    product, out = None, []
    for blk in model.blocks:
        block = mlp_matrix(blk, samples) @ attention_matrix(blk)
        product = block if product is None else block @ product
        u, _, _ = torch.linalg.svd(product)
        out.append(u[:, 0])
    return out
