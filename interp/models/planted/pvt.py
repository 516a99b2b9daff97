"""``planted_pvt``: the planted circuit carried through a pyramid (a PVTv2-b0)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .circuit import (N_FILTERS, checked_neurons, PlantedPyramidTruth, _ANCHOR, _Plan, _TRUTH_ATTR,
                      _plant_register_neurons, _plant_texture_neurons, _zero_mean_filters)


PLANTED_PVT_NAME = "planted_pvt"


@dataclass(frozen=True)
class PlantedPvtTruth(PlantedPyramidTruth):
    """What :func:`planted_pvt` planted: ``layer`` is the flat block index of ``stages.{stage}.blocks.{block}``,
    and the high-norm tokens live on that stage's grid."""

    description: str = "synthetic PVTv2-b0 with planted register neurons (random weights; not a trained model)"


def planted_pvt(*, stage: int = 3, block: int = 0, neurons: Sequence[int] = (17, 101, 402, 655),
                img_size: int = 224, num_classes: int = 10, tau: float = 0.03, seed: int = 0) -> nn.Module:
    """Build the planted PVTv2-b0 (a plain timm ``PyramidVisionTransformerV2`` in eval mode) with its truth.

    The circuit of :func:`planted_vit` carried through a pyramid: reserved residual dims ``0..F+3`` in every stage
    (F filter responses, texture, artifact, two anchors at +A and -A). The patch embedding computes the filter
    responses and the anchors; block ``stages.0.blocks.0``'s MLP the texture energy; each stage boundary (the
    stage's LayerNorm, the downsampling convolution and its LayerNorm) averages the texture over 2x2 cells and
    re-creates the anchors (the LayerNorms' gains on the reserved dims undo their scaling); in
    ``stages.{stage}.blocks.{block}`` the register ``neurons`` fire on flat tokens (texture below ``tau``) and write
    into the artifact dim; the later blocks of that stage sink attention onto them where their keys are the tokens
    themselves (stage 3; stages 0-2 reduce their keys spatially and get no sink). The planted neurons' depthwise
    convolutions are the identity, so they read their own token only. Everything else is timm's random init.

    Args:
        stage, block: where the register neurons sit (``stages.{stage}.blocks.{block}``; a stage of PVTv2-b0 has
            2 blocks); high norms appear from that block's MLP on, on that stage's grid.
        neurons: indices of the register neurons in that MLP (``mlp_ratio * width`` of the stage: 1024 in stage 3).
        tau: texture energy under which a token's region counts as flat.
        img_size: the input size recorded in the config (PVTv2 takes any size).

    Returns:
        ``timm.models.pvt_v2.PyramidVisionTransformerV2``; :func:`planted_truth` gives its :class:`PlantedPvtTruth`.
    """
    from timm.models.pvt_v2 import PyramidVisionTransformerV2

    torch.manual_seed(seed)
    model = PyramidVisionTransformerV2(depths=(2, 2, 2, 2), embed_dims=(32, 64, 160, 256), num_heads=(1, 2, 5, 8),
                                       num_classes=num_classes)
    stages = model.stages
    if not 0 <= stage < len(stages) or not 0 <= block < len(stages[stage].blocks):
        raise ValueError(f"stages.{stage}.blocks.{block} does not exist in PVTv2-b0 (4 stages of 2 blocks)")
    n_filters = N_FILTERS
    d_mlp = stages[stage].blocks[block].mlp.fc2.in_features
    neurons = checked_neurons(neurons, d_mlp, 2 * n_filters if stage == 0 and block == 0 else 0)
    model.pretrained_cfg = {"architecture": PLANTED_PVT_NAME, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                            "input_size": (3, img_size, img_size), "interpolation": "bicubic",
                            "crop_pct": 0.875, "crop_mode": "center", "num_classes": num_classes}
    model.default_cfg = model.pretrained_cfg
    with torch.no_grad():
        plans = [_Plan(n_filters=n_filters, tau=tau, sigma=_ANCHOR * math.sqrt(2.0 / s.blocks[0].mlp.fc2.out_features))
                 for s in stages]
        _plant_pvt_embedding(model, plans[0], torch.Generator().manual_seed(seed + 1))
        for s, st in enumerate(stages):
            plan = plans[s]
            for blk in st.blocks:
                _protect_reserved(plan, blk.attn.proj, blk.mlp.fc2)
            if s < len(stages) - 1:  # the last stage's norm is the model's final norm: left as timm built it
                _restore_scale(st.norm, plan)
            if s > 0:
                _plant_downsample(st.downsample, plans[s - 1], plan)
        _plant_pvt_anchors(stages[0].blocks[0].attn, plans[0])
        _plant_pvt_neurons(stages[0].blocks[0].mlp, range(2 * n_filters), plans[0])
        _plant_texture_neurons(stages[0].blocks[0].mlp, plans[0])
        _plant_pvt_neurons(stages[stage].blocks[block].mlp, neurons, plans[stage])
        _plant_register_neurons(stages[stage].blocks[block].mlp, neurons, plans[stage])
        for blk in stages[stage].blocks[block + 1:]:
            if blk.attn.sr is None:  # stages 0-2 reduce their keys spatially: no key is one token there
                _plant_sr_attention_sink(blk.attn, plans[stage])
    layer = sum(len(s.blocks) for s in stages[:stage]) + block
    truth = PlantedPvtTruth(layer=layer, neurons=neurons, tau=tau, n_filters=n_filters, texture_dim=plans[0].tex,
                            artifact_dim=plans[0].art, anchor_dims=(plans[0].pos_anchor, plans[0].neg_anchor),
                            patch_size=int(model.patch_embed.proj.stride[0]), gelu_gain=plans[0].gelu_gain,
                            stage=stage, block=block)
    setattr(model, _TRUTH_ATTR, truth)
    return model.eval()


def _restore_scale(norm: nn.LayerNorm, plan: _Plan) -> None:
    """A LayerNorm whose reserved dims keep the scale of its input (gain = the anchors' spread, bias 0)."""
    norm.weight[plan.reserved] = plan.sigma
    norm.bias[plan.reserved] = 0.0


def _protect_reserved(plan: _Plan, *writers: nn.Linear) -> None:
    """No write into the reserved dims from these layers (a block's attention ``proj`` and MLP ``fc2``)."""
    for layer in writers:
        layer.weight[plan.reserved] = 0.0
        layer.bias[plan.reserved] = 0.0


def _plant_pvt_embedding(model: nn.Module, plan: _Plan, generator: torch.Generator) -> None:
    """Filters and anchors into the overlapping patch embedding.

    The convolution's anchors (+-A) set its LayerNorm's scale; its output channels sum to zero for every input
    (the random channels absorb the filters' sum), so the LayerNorm subtracts no mean and its gains may differ:
    the filter responses keep their scale, the anchors come out at about +-1 (``hook_patch_embed`` shows the
    patch's content, not the anchors, so neighbour similarity means something), and stage 0's first attention
    adds them back to +-A (its ``proj`` bias; see :func:`_plant_pvt_anchors`).
    """
    pe = model.patch_embed.proj
    pe.weight[plan.reserved] = 0.0
    pe.bias[plan.reserved] = 0.0
    pe.weight[:plan.n_filters] = _zero_mean_filters(plan.n_filters, pe.kernel_size[0], generator)
    pe.bias[plan.pos_anchor] = _ANCHOR
    pe.bias[plan.neg_anchor] = -_ANCHOR
    others = [c for c in range(pe.out_channels) if c >= plan.reserved.stop]
    pe.weight[others] -= pe.weight.sum(0, keepdim=True) / len(others)
    pe.bias[others] -= pe.bias.sum() / len(others)
    _restore_scale(model.patch_embed.norm, plan)
    model.patch_embed.norm.weight[[plan.pos_anchor, plan.neg_anchor]] = plan.sigma / _ANCHOR  # anchors out at ~+-1


def _plant_pvt_anchors(attn: nn.Module, plan: _Plan) -> None:
    """Stage 0's first attention restores the anchors to about +-A (they leave the embedding at about +-1)."""
    attn.proj.bias[plan.pos_anchor] = _ANCHOR - 1.0
    attn.proj.bias[plan.neg_anchor] = -(_ANCHOR - 1.0)


def _plant_downsample(ds: nn.Module, before: _Plan, after: _Plan) -> None:
    """A stage's downsampling: the texture averaged over the 2x2 cells each output reads (the kernel's taps
    (1, 1), (1, 2), (2, 1), (2, 2) with stride 2 and padding 1), anchors re-created, other reserved dims 0."""
    conv = ds.proj
    conv.weight[:, before.reserved] = 0.0  # its input's reserved dims keep the anchors' scale: read by nothing else
    conv.weight[after.reserved] = 0.0
    conv.bias[after.reserved] = 0.0
    for i in (1, 2):  # input: the previous stage norm's output, x - mean on the reserved dims (anchors cancel it)
        for j in (1, 2):
            conv.weight[after.tex, before.tex, i, j] = 0.25
            conv.weight[after.tex, before.pos_anchor, i, j] = -0.125
            conv.weight[after.tex, before.neg_anchor, i, j] = -0.125
    conv.bias[after.pos_anchor] = _ANCHOR
    conv.bias[after.neg_anchor] = -_ANCHOR
    _restore_scale(ds.norm, after)


def _plant_pvt_neurons(mlp: nn.Module, neurons, plan: _Plan) -> None:
    """The depthwise convolution passes these neurons through unchanged (each reads its own token only)."""
    for n in neurons:
        mlp.dwconv.weight[n] = 0.0
        mlp.dwconv.weight[n, 0, 1, 1] = 1.0
        mlp.dwconv.bias[n] = 0.0


def _plant_sr_attention_sink(attn: nn.Module, plan: _Plan) -> None:
    """Every head of a PVTv2 attention: a constant query component meets a key reading the artifact dim."""
    if attn.sr is not None:
        raise ValueError("the attention sink is planted only where keys are the tokens themselves (sr 1)")
    dim = attn.q.in_features
    for h in range(attn.num_heads):
        row = h * attn.head_dim
        attn.q.weight[row] = 0.0
        attn.q.bias[row] = plan.sink_q
        attn.kv.weight[row] = 0.0
        plan.read(attn.kv.weight[row], plan.art, 1.0)
        attn.kv.bias[row] = 0.0
    attn.kv.weight[dim:, plan.art] = 0.0
