"""``plant``: the planted circuit (:mod:`.circuit`) applied to a random-init timm model of any family, through
its family adapter (:func:`~interp.models.families.family_of`): its blocks, their MLPs and LayerScale, whether a
norm follows the MLP (a post-norm block), its stages, which attention lets every token share a key.

The adapter's answers decide what differs between families: the anchors enter through the position embedding
where the model has one, else through the patch embedding's bias and the prefix tokens; a normed patch embedding
(a pyramid's) brings them out at +-1 and the first block restores them; a pre-norm block's planted neurons read
the LayerNorm's output (anchors cancel its mean), a post-norm block's read the raw residual and its MLP writes
through a linearised post-norm; LayerScale is 1 on the reserved dims and carries part of the register write;
every stage boundary averages the texture over 2x2 cells; attention sinks are planted in the later blocks of
the register neurons' stage whose keys are the tokens themselves (RoPE's steadiest dim where the model rotates).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Type

import torch
from torch import nn

from ..families import Family, family_of
from ..families.positions import positions_of
from .circuit import (ANCHOR, LAYER_SCALE_GAIN, N_FILTERS, Plan, checked_neurons, linear_post_norm, own_token_only,
                      plant_attention_sink, plant_boundary, plant_embedding, plant_register_neurons,
                      plant_texture_neurons, protect_reserved, restore_anchors, restore_scale, steadiest_rope_dim)
from .truth import TRUTH_ATTR, PlantedPyramidTruth, PlantedTruth


def plant(model: nn.Module, name: str, where: str, *, neurons: Sequence[int], tau: float, seed: int, img_size: int,
          truth: Type[PlantedTruth] = PlantedTruth, description: Optional[str] = None,
          wash: Optional[int] = None) -> nn.Module:
    """Plant the circuit into ``model`` (a random-init timm model of a registered family), in place.

    Args:
        name: the planted model's name (``pretrained_cfg["architecture"]``).
        where: the hook-name prefix of the block whose MLP holds the register neurons (``blocks.2``,
            ``stages.3.blocks.0``).
        neurons: the register neurons in that MLP; tau: the texture energy under which a token counts as flat.
        seed: filters drawn from ``seed + 1``; img_size: the input size recorded in the config.
        truth: the truth class (a :class:`PlantedPyramidTruth` records the block's stage and index in it).
        description: the truth's description (its class default when None).
        wash: a later block whose MLP writes the artifacts out again (the sinks stop before it), or None.

    Returns:
        ``model`` in eval mode, its :class:`PlantedTruth` kept on it (:func:`planted_truth`).

    Raises:
        ValueError: ``where`` is no block of the model, or ``neurons`` out of range.
    """
    model.pretrained_cfg = {"architecture": name, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                            "input_size": (3, img_size, img_size), "interpolation": "bicubic",
                            "crop_pct": 0.875, "crop_mode": "center", "num_classes": model.num_classes}
    model.default_cfg = model.pretrained_cfg
    family = family_of(model)
    prefixes = [prefix for prefix, _ in family.blocks()]
    if where not in prefixes:
        raise ValueError(f"{where} does not exist in {name} (its blocks: {prefixes[0]} .. {prefixes[-1]})")
    layer = prefixes.index(where)
    if layer == 0 and family.write_norms(0)[1] is not None:
        raise ValueError(f"{where} computes the texture the register neurons read: plant them later")
    neurons = checked_neurons(neurons, family.d_mlp(layer), 2 * N_FILTERS if layer == 0 else 0)
    plans = [Plan(n_filters=N_FILTERS, tau=tau, sigma=ANCHOR * math.sqrt(2.0 / family.d_model(i)),
                  normed=family.write_norms(i)[1] is None) for i in range(len(prefixes))]
    stages = family.block_stages() or (0,) * len(prefixes)
    with torch.no_grad():
        _plant_structure(family, plans, stages, seed)
        _plant_mlp(family, 0, plans[0])
        _plant_mlp(family, layer, plans[layer], neurons)
        if wash is not None:
            _plant_mlp(family, wash, plans[wash], neurons)
            family.mlp_out_proj(wash).weight[plans[wash].art] *= -1.0
        positions = positions_of(model)
        rope = None if positions is None else positions.rope_embed(family.layout().grid)
        dim = 0 if rope is None else steadiest_rope_dim(rope)
        for i in range(layer + 1, len(prefixes) if wash is None else wash):
            if stages[i] == stages[layer] and family.attends_to_tokens(i):
                plant_attention_sink(family.attn_in_proj(i), family.n_heads(i), plans[i], dim,
                                     rope_partner=rope is not None)
    p = plans[0]
    extra = {} if description is None else {"description": description}
    if issubclass(truth, PlantedPyramidTruth):
        extra.update(stage=stages[layer], block=layer - stages.index(stages[layer]))
    else:
        extra.update(washed_at=wash)
    setattr(model, TRUTH_ATTR, truth(layer=layer, neurons=neurons, tau=tau, n_filters=p.n_filters, texture_dim=p.tex,
                                     artifact_dim=p.art, anchor_dims=(p.pos_anchor, p.neg_anchor),
                                     patch_size=family.patch_size[0], gelu_gain=p.gelu_gain, **extra))
    return model.eval()


def _plant_structure(family: Family, plans: Sequence[Plan], stages: Sequence[int], seed: int) -> None:
    """What every token carries: filters and anchors from the embedding, no random write into (pre-norm blocks)
    or read of (post-norm blocks) the reserved dims, reserved dims kept through every stage boundary."""
    positions = positions_of(family.module)
    plant_embedding(family.patch_proj(), family.patch_norm(), family.prefix_tokens(),
                    None if positions is None else positions.table, plans[0], torch.Generator().manual_seed(seed + 1))
    for i, plan in enumerate(plans):
        if plan.normed:
            protect_reserved(plan, family.attn_out_proj(i), family.mlp_out_proj(i),
                             gains=(family.attn_gain(i), family.mlp_gain(i)))
        else:  # the raw residual's anchors are +-A: no random neuron reads a reserved dim
            family.mlp_in_proj(i).weight[:, plan.reserved] = 0.0
    stage_plans = [plans[stages.index(s)] for s in range(len(family.stages()))]
    for s, plan in enumerate(stage_plans):
        norm = family.stage_norm(s)
        if s < len(stage_plans) - 1 and norm is not None:
            restore_scale(norm, plan)  # the last stage's norm is the model's final norm: as built
        downsampling = family.downsampling(s)
        if downsampling is not None:
            plant_boundary(*downsampling, stage_plans[s - 1], plan)
    if isinstance(family.patch_norm(), nn.LayerNorm):
        bias = family.attn_norm(0).bias if not plans[0].normed else family.attn_out_proj(0).bias
        restore_anchors(bias, plans[0])


def _plant_mlp(family: Family, layer: int, plan: Plan, neurons: Optional[Sequence[int]] = None) -> None:
    """The texture neurons (``neurons`` None: ``0 .. 2F-1``) or the register ``neurons`` into block ``layer``'s
    MLP: each reads its own token only, LayerScale carries part of the register write, and behind a post-norm the
    MLP writes through the planted dim alone."""
    fc_in, fc_out, post_norm = family.mlp_in_proj(layer), family.mlp_out_proj(layer), family.write_norms(layer)[1]
    texture = neurons is None
    if post_norm is not None:
        fc_out.weight.zero_()
    own_token_only(family.mlp_token_conv(layer), range(2 * plan.n_filters) if texture else neurons)
    if texture:
        plant_texture_neurons(fc_in, fc_out, plan)
    else:
        plant_register_neurons(fc_in, fc_out, neurons, plan)
        gain = family.mlp_gain(layer)
        if gain is not None:
            gain[plan.art] = LAYER_SCALE_GAIN
            fc_out.weight[plan.art] /= LAYER_SCALE_GAIN
    if post_norm is not None:
        linear_post_norm(fc_out, post_norm, plan.tex if texture else plan.art)
