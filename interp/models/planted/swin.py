"""``planted_swin``: the planted circuit carried through a Swin-v2 (residual post-norm, patch merging)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .circuit import (N_FILTERS, PlantedPyramidTruth, _ANCHOR, _Plan, _TRUTH_ATTR, _zero_mean_filters,
                      checked_neurons)

PLANTED_SWIN_NAME = "planted_swin"
# the constant channel of a planted MLP's output: it sets the post-norm's scale, so that the norm passes the
# planted write through (nearly) linearly; the norm's gain on it is 0, so it never reaches the residual
_SCALE = 1e4


@dataclass(frozen=True)
class PlantedSwinTruth(PlantedPyramidTruth):
    """What :func:`planted_swin` planted: ``layer`` is the flat block index of ``layers.{stage}.blocks.{block}``,
    and the high-norm tokens live on that stage's grid."""

    description: str = "synthetic Swin-v2 with planted register neurons (random weights; not a trained model)"


def planted_swin(*, stage: int = 3, block: int = 0, neurons: Sequence[int] = (17, 101, 402, 655),
                 img_size: int = 224, num_classes: int = 10, tau: float = 0.03, seed: int = 0) -> nn.Module:
    """Build the planted Swin-v2 (a plain timm ``SwinTransformerV2`` in eval mode: embed dim 32, 4 stages of 2
    blocks, window 7, 224 px: grids 56, 28, 14, 7) with its truth.

    The circuit of :func:`planted_vit` carried through Swin-v2's residual post-norm blocks (``x + norm1(attn(x))``,
    ``x + norm2(mlp(x))``, the MLP reading the raw residual): reserved residual dims ``0..F+3`` in every stage
    (F filter responses, texture, artifact, two anchors at +A and -A). The patch embedding computes the filter
    responses and the anchors (its LayerNorm brings the anchors out at about +-1, so ``hook_patch_embed`` shows
    the patch's content; stage 0's first ``norm1`` bias adds them back to +-A); ``layers.0.blocks.0``'s MLP
    computes the texture energy; every patch merging averages it over 2x2 cells and re-creates the anchors (the
    merging's outputs sum to zero, so its LayerNorm subtracts no mean; its gains on the reserved dims undo its
    scaling); in ``layers.{stage}.blocks.{block}`` the register ``neurons`` fire on flat tokens (texture below
    ``tau``) and write into the artifact dim. A planted MLP's output also carries a constant channel
    (:data:`_SCALE`) that sets its post-norm's scale, so the post-norm passes the planted write through nearly
    linearly (its gain is zero on every other dim). No other MLP neuron reads a reserved dim. Everything else is
    timm's random init, whose post-norm gains are zero: the other blocks add nothing, and no attention sink is
    planted (a window's cosine attention has no key every token shares).

    Args:
        stage, block: where the register neurons sit (``layers.{stage}.blocks.{block}``; 2 blocks a stage).
        neurons: indices of the register neurons in that MLP (``4 * width`` of the stage: 1024 in stage 3).
        tau: texture energy under which a token's region counts as flat.
        img_size: the input size (a multiple of 32 keeps every merging exact: 224 px).

    Returns:
        ``timm.models.swin_transformer_v2.SwinTransformerV2``; :func:`planted_truth` gives its
        :class:`PlantedSwinTruth`.
    """
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    torch.manual_seed(seed)
    model = SwinTransformerV2(img_size=img_size, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                              window_size=7, num_classes=num_classes)
    stages = model.layers
    if not 0 <= stage < len(stages) or not 0 <= block < len(stages[stage].blocks):
        raise ValueError(f"layers.{stage}.blocks.{block} does not exist in planted_swin (4 stages of 2 blocks)")
    if (stage, block) == (0, 0):
        raise ValueError("layers.0.blocks.0 computes the texture the register neurons read: plant them later")
    n_filters = N_FILTERS
    neurons = checked_neurons(neurons, stages[stage].blocks[block].mlp.fc2.in_features, 0)
    model.pretrained_cfg = {"architecture": PLANTED_SWIN_NAME, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                            "input_size": (3, img_size, img_size), "interpolation": "bicubic",
                            "crop_pct": 0.875, "crop_mode": "center", "num_classes": num_classes}
    model.default_cfg = model.pretrained_cfg
    with torch.no_grad():
        plans = [_Plan(n_filters=n_filters, tau=tau,
                       sigma=_ANCHOR * math.sqrt(2.0 / s.blocks[0].mlp.fc2.out_features)) for s in stages]
        _plant_embedding(model, plans[0], torch.Generator().manual_seed(seed + 1))
        for s, st in enumerate(stages):
            for blk in st.blocks:  # no random neuron reads a reserved dim (the raw residual's anchors are +-A)
                blk.mlp.fc1.weight[:, plans[s].reserved] = 0.0
            if s > 0:
                _plant_merging(st.downsample, plans[s - 1], plans[s])
        first = stages[0].blocks[0]
        first.norm1.bias[plans[0].pos_anchor] = _ANCHOR - 1.0  # the anchors back to +-A (they leave the embedding
        first.norm1.bias[plans[0].neg_anchor] = -(_ANCHOR - 1.0)  # at +-1)
        _plant_texture(first, plans[0])
        _plant_registers(stages[stage].blocks[block], neurons, plans[stage])
    layer = sum(len(s.blocks) for s in stages[:stage]) + block
    truth = PlantedSwinTruth(layer=layer, neurons=neurons, tau=tau, n_filters=n_filters, texture_dim=plans[0].tex,
                             artifact_dim=plans[0].art, anchor_dims=(plans[0].pos_anchor, plans[0].neg_anchor),
                             patch_size=int(model.patch_embed.proj.stride[0]), gelu_gain=plans[0].gelu_gain,
                             stage=stage, block=block)
    setattr(model, _TRUTH_ATTR, truth)
    return model.eval()


def _plant_embedding(model: nn.Module, plan: _Plan, generator: torch.Generator) -> None:
    """Filters and anchors into the 4x4 patch embedding; its output channels sum to zero for every input (the
    random channels absorb the rest), so its LayerNorm subtracts no mean: the filter responses keep their scale
    (gain = the anchors' spread), the anchors come out at about +-1."""
    pe = model.patch_embed.proj
    pe.weight[plan.reserved] = 0.0
    pe.bias[plan.reserved] = 0.0
    pe.weight[:plan.n_filters] = _zero_mean_filters(plan.n_filters, pe.kernel_size[0], generator)
    pe.bias[plan.pos_anchor] = _ANCHOR
    pe.bias[plan.neg_anchor] = -_ANCHOR
    others = [c for c in range(pe.out_channels) if c >= plan.reserved.stop]
    pe.weight[others] -= pe.weight.sum(0, keepdim=True) / len(others)
    pe.bias[others] -= pe.bias.sum() / len(others)
    norm = model.patch_embed.norm
    norm.weight[plan.reserved] = plan.sigma
    norm.bias[plan.reserved] = 0.0
    norm.weight[[plan.pos_anchor, plan.neg_anchor]] = plan.sigma / _ANCHOR


def _plant_merging(merging: nn.Module, before: _Plan, after: _Plan) -> None:
    """A patch merging: the texture averaged over the 2x2 cells (its 4 input chunks), the anchors re-created as
    the mean of the input anchors, the other reserved dims 0; no other output reads a reserved input dim, and
    every input's outputs sum to zero (no mean for the LayerNorm to subtract)."""
    red = merging.reduction
    width = red.in_features // 4
    chunks = range(4)
    for j in chunks:
        red.weight[:, j * width + before.reserved.start:j * width + before.reserved.stop] = 0.0
    red.weight[after.reserved] = 0.0
    for j in chunks:
        red.weight[after.tex, j * width + before.tex] = 0.25
        red.weight[after.pos_anchor, j * width + before.pos_anchor] = 0.25
        red.weight[after.neg_anchor, j * width + before.neg_anchor] = 0.25
    others = [c for c in range(red.out_features) if c >= after.reserved.stop]
    red.weight[others] -= red.weight.sum(0, keepdim=True) / len(others)
    merging.norm.weight[after.reserved] = after.sigma
    merging.norm.bias[after.reserved] = 0.0


def _linear_post_norm(block: nn.Module, dim: int) -> None:
    """The block's MLP writes only through ``dim``: its output is the planted write plus the constant channel
    (the last one), and ``norm2`` passes the write through (gain and bias undo the normalisation at the
    constant's scale), nothing else."""
    mlp, norm = block.mlp, block.norm2
    width = mlp.fc2.out_features
    mlp.fc2.bias.zero_()
    mlp.fc2.bias[width - 1] = _SCALE
    norm.weight.zero_()
    norm.bias.zero_()
    norm.weight[dim] = _SCALE / math.sqrt(width - 1)  # LN of (v e_dim + S e_last) is about v sqrt(w-1) / S ...
    norm.bias[dim] = _SCALE / (width - 1)  # ... - 1 / sqrt(w-1): back to v


def _plant_texture(block: nn.Module, plan: _Plan) -> None:
    """Stage 0's first MLP: texture energy (pairs of GELU neurons reading +-each filter) into the texture dim."""
    mlp = block.mlp
    mlp.fc2.weight.zero_()
    for f in range(plan.n_filters):
        for sign, n in ((1.0, 2 * f), (-1.0, 2 * f + 1)):
            mlp.fc1.weight[n] = 0.0
            mlp.fc1.weight[n, f] = sign * plan.gelu_gain
            mlp.fc1.bias[n] = 0.0
            mlp.fc2.weight[plan.tex, n] = 1.0 / plan.gelu_gain
    _linear_post_norm(block, plan.tex)


def _plant_registers(block: nn.Module, neurons: Sequence[int], plan: _Plan) -> None:
    """The register neurons: fire as ``GELU(fire (1 - E / tau))`` on the raw texture dim, write into the artifact
    dim (the only write of this MLP)."""
    mlp = block.mlp
    mlp.fc2.weight.zero_()
    for n in neurons:
        mlp.fc1.weight[n] = 0.0
        mlp.fc1.weight[n, plan.tex] = -plan.fire / plan.tau
        mlp.fc1.bias[n] = plan.fire
        mlp.fc2.weight[plan.art, n] = plan.w_out
    _linear_post_norm(block, plan.art)
