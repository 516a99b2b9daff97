"""``planted_vit``: the planted register-neuron circuit in a small timm ViT."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

from .circuit import (N_FILTERS, check_sink_layer, checked_neurons, PlantedTruth, _ANCHOR, _Plan, _TRUTH_ATTR,
                      _plant_attention_sink, _plant_inputs, _plant_register_neurons, _plant_texture_neurons)


PLANTED_NAME = "planted_vit"


def planted_vit(
    *,
    layer: int = 2,
    neurons: Sequence[int] = (17, 101, 402, 655),
    depth: int = 6,
    embed_dim: int = 192,
    num_heads: int = 3,
    img_size: int = 224,
    patch_size: int = 16,
    num_classes: int = 10,
    tau: float = 0.03,
    seed: int = 0,
    wash: Optional[int] = None,
) -> nn.Module:
    """Build the planted ViT (a plain timm ``VisionTransformer`` in eval mode) with its ground truth.

    Args:
        layer: block whose MLP holds the register neurons (0-indexed); high norms appear after its MLP.
        neurons: indices of the planted register neurons in that MLP (hidden size ``4 * embed_dim``).
        tau: texture energy under which a patch counts as flat (becomes a high-norm token).
        seed: seed of the random weights; the same arguments always give the same weights.
        wash: a block after ``layer`` whose MLP washes the artifacts out (the same neurons, reading the same
            texture, write the opposite: the artifact channel returns to about 0), or None: the high norms then
            live in blocks ``layer .. wash - 1`` only, and the last block has none. Attention sinks are planted
            in the blocks between.

    Returns:
        ``timm.models.vision_transformer.VisionTransformer``; :func:`planted_truth` gives its
        :class:`PlantedTruth`. Wrap it with ``interp.HookedViT.from_timm`` (``interp.load("planted_vit")`` does both).
    """
    from timm.models.vision_transformer import VisionTransformer

    check_sink_layer(layer, depth)
    if wash is not None and not layer + 1 < wash < depth:
        raise ValueError(f"wash must be a block in [{layer + 2}, {depth - 1}]: after the block after layer")
    d_mlp = 4 * embed_dim
    n_filters = N_FILTERS
    neurons = checked_neurons(neurons, d_mlp, 2 * n_filters)

    torch.manual_seed(seed)
    model = VisionTransformer(img_size=img_size, patch_size=patch_size, embed_dim=embed_dim, depth=depth,
                              num_heads=num_heads, mlp_ratio=4.0, qkv_bias=True, num_classes=num_classes,
                              class_token=True, global_pool="token")
    model.pretrained_cfg = {"architecture": PLANTED_NAME, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                            "input_size": (3, img_size, img_size), "interpolation": "bicubic",
                            "crop_pct": 0.875, "crop_mode": "center", "num_classes": num_classes}
    model.default_cfg = model.pretrained_cfg
    plan = _Plan(n_filters=n_filters, tau=tau, sigma=_ANCHOR * math.sqrt(2.0 / embed_dim))
    with torch.no_grad():
        _plant_inputs(model, plan, patch_size, torch.Generator().manual_seed(seed + 1))
        _plant_texture_neurons(model.blocks[0].mlp, plan)
        _plant_register_neurons(model.blocks[layer].mlp, neurons, plan)
        for block in model.blocks[layer + 1:wash]:
            _plant_attention_sink(block.attn, plan)
        if wash is not None:
            _plant_register_neurons(model.blocks[wash].mlp, neurons, plan)
            model.blocks[wash].mlp.fc2.weight[plan.art] *= -1.0
    truth = PlantedTruth(layer=layer, neurons=neurons, tau=tau, n_filters=n_filters, texture_dim=plan.tex,
                         artifact_dim=plan.art, anchor_dims=(plan.pos_anchor, plan.neg_anchor),
                         patch_size=patch_size, gelu_gain=plan.gelu_gain, washed_at=wash)
    setattr(model, _TRUTH_ATTR, truth)
    return model.eval()
