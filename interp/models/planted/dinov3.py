"""``planted_dinov3``: the planted circuit in a small model of DINOv3's architecture (timm ``Eva``)."""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from .circuit import (N_FILTERS, check_sink_layer, checked_neurons, PlantedTruth, _ANCHOR, _Plan, _TRUTH_ATTR,
                      _plant_register_neurons, _plant_texture_neurons, _zero_mean_filters)


PLANTED_DINOV3_NAME = "planted_dinov3"
_LS_GAIN = 5.0  # LayerScale gamma_2 on the artifact dim of the planted block: fc2 writes w_out / gain


def planted_dinov3(
    *,
    layer: int = 2,
    neurons: Sequence[int] = (17, 101, 402, 655),
    depth: int = 6,
    embed_dim: int = 192,
    num_heads: int = 3,
    img_size: int = 224,
    num_classes: int = 10,
    tau: float = 0.03,
    layer_scale: float = 0.5,
    seed: int = 0,
) -> nn.Module:
    """The planted circuit of :func:`planted_vit` in a small model of DINOv3's architecture (a plain timm ``Eva``
    built as ``vit_small_patch16_dinov3_qkvb``: patch 16, RoPE, 4 storage tokens, LayerScale), in eval mode.

    What differs from :func:`planted_vit`: there is no absolute position embedding, so the anchors come from
    the patch embedding's bias (patches) and from the CLS and storage tokens themselves (both textured, so they
    never trigger); LayerScale is ``layer_scale`` on every dim except the reserved ones (1), and on the artifact
    dim of block ``layer`` it is ``5`` with ``fc2`` writing ``w_out / 5``: the register neurons' write direction
    is ``gamma_2 * fc2[:, n]``, not ``fc2[:, n]`` alone; the attention sinks use the head dim whose RoPE angle
    varies least over the grid (with its rotation partner zeroed), so RoPE barely changes them.

    Args: as :func:`planted_vit` (patch size 16), plus ``layer_scale``: LayerScale of every non-reserved dim.

    Returns:
        ``timm.models.eva.Eva``; :func:`planted_truth` gives its :class:`PlantedTruth`. ``interp.load("planted_dinov3")``
        wraps it in a ``HookedViT``.
    """
    import timm

    patch_size = 16
    check_sink_layer(layer, depth)
    d_mlp = 4 * embed_dim
    n_filters = N_FILTERS
    neurons = checked_neurons(neurons, d_mlp, 2 * n_filters)

    torch.manual_seed(seed)
    model = timm.create_model("vit_small_patch16_dinov3_qkvb", pretrained=False, img_size=img_size,
                              embed_dim=embed_dim, depth=depth, num_heads=num_heads, num_classes=num_classes,
                              global_pool="token", init_values=layer_scale)
    model.pretrained_cfg = {"architecture": PLANTED_DINOV3_NAME, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                            "input_size": (3, img_size, img_size), "interpolation": "bicubic",
                            "crop_pct": 0.875, "crop_mode": "center", "num_classes": num_classes}
    model.default_cfg = model.pretrained_cfg
    plan = _Plan(n_filters=n_filters, tau=tau, sigma=_ANCHOR * math.sqrt(2.0 / embed_dim))
    with torch.no_grad():
        _plant_eva_inputs(model, plan, patch_size, torch.Generator().manual_seed(seed + 1))
        _plant_texture_neurons(model.blocks[0].mlp, plan)
        _plant_register_neurons(model.blocks[layer].mlp, neurons, plan)
        gamma = model.blocks[layer].gamma_2
        gamma[plan.art] = _LS_GAIN
        model.blocks[layer].mlp.fc2.weight[plan.art] /= _LS_GAIN
        sink_dim = _steadiest_rope_dim(model)
        for block in model.blocks[layer + 1:]:
            _plant_eva_attention_sink(block.attn, plan, sink_dim)
    truth = PlantedTruth(layer=layer, neurons=neurons, tau=tau, n_filters=n_filters, texture_dim=plan.tex,
                         artifact_dim=plan.art, anchor_dims=(plan.pos_anchor, plan.neg_anchor),
                         patch_size=patch_size, gelu_gain=plan.gelu_gain,
                         description="synthetic DINOv3-architecture model (timm Eva) with planted register neurons "
                                     "(random weights; not a trained model)")
    setattr(model, _TRUTH_ATTR, truth)
    return model.eval()


def _plant_eva_inputs(model: nn.Module, plan: _Plan, patch_size: int, generator: torch.Generator) -> None:
    """Filters into the patch embedding, anchors into its bias and into the CLS and storage tokens (textured), no
    writes into the reserved dims from any attention ``proj`` or MLP ``fc2``, LayerScale 1 on the reserved dims."""
    reserved = plan.reserved
    pe = model.patch_embed.proj
    pe.weight[reserved] = 0.0
    pe.bias[reserved] = 0.0
    pe.weight[:plan.n_filters] = _zero_mean_filters(plan.n_filters, patch_size, generator)
    pe.bias[plan.pos_anchor] = _ANCHOR
    pe.bias[plan.neg_anchor] = -_ANCHOR
    for token in (model.cls_token, model.reg_token):
        token[..., reserved] = 0.0
        token[..., plan.pos_anchor] = _ANCHOR
        token[..., plan.neg_anchor] = -_ANCHOR
        token[..., plan.tex] = 10.0 * plan.tau  # prefix tokens never look flat
    for block in model.blocks:
        block.attn.proj.weight[reserved] = 0.0
        block.attn.proj.bias[reserved] = 0.0
        block.mlp.fc2.weight[reserved] = 0.0
        block.mlp.fc2.bias[reserved] = 0.0
        block.gamma_1[reserved] = 1.0
        block.gamma_2[reserved] = 1.0


def _steadiest_rope_dim(model: nn.Module) -> int:
    """The head dim j < head_dim / 2 whose RoPE angle varies least over the model's patch grid (RoPE rotates the
    pair (j, j + head_dim / 2) of each head in DINOv3's half layout)."""
    grid = tuple(int(g) for g in model.patch_embed.grid_size)
    sin, _ = model.rope.get_embed(shape=grid).tensor_split(2, dim=-1)  # [n_patches, head_dim] each
    half = sin.shape[-1] // 2
    return int(sin[:, :half].abs().amax(dim=0).argmin())


def _plant_eva_attention_sink(attn: nn.Module, plan: _Plan, j: int) -> None:
    """Every head: a constant query component on head dim ``j`` meets a key component there reading the artifact
    dim (RoPE's partner dim ``j + head_dim / 2`` zeroed in q and k, so the rotation only scales it by cos of a
    small angle); values ignore the artifact dim."""
    qkv, embed_dim, head_dim = attn.qkv, attn.qkv.in_features, attn.head_dim
    for h in range(attn.num_heads):
        q_row, partner = h * head_dim + j, h * head_dim + j + head_dim // 2
        qkv.weight[q_row] = 0.0
        attn.q_bias[q_row] = plan.sink_q
        qkv.weight[embed_dim + q_row] = 0.0
        plan.read(qkv.weight[embed_dim + q_row], plan.art, 1.0)
        for row in (partner, embed_dim + partner):
            qkv.weight[row] = 0.0
        attn.q_bias[partner] = 0.0
    qkv.weight[2 * embed_dim:, plan.art] = 0.0
