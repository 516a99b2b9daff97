"""The planted models users load by name: a small random-init timm model of one family, built with a fixed seed,
and the one planted circuit applied to it through its family adapter (:func:`~.plant.plant`)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from .plant import plant
from .truth import PlantedPvtTruth, PlantedSwinTruth

PLANTED_NAME = "planted_vit"
PLANTED_DINOV3_NAME = "planted_dinov3"
PLANTED_PVT_NAME = "planted_pvt"
PLANTED_SWIN_NAME = "planted_swin"
_DINOV3 = ("synthetic DINOv3-architecture model (timm Eva) with planted register neurons (random weights; not a "
           "trained model)")


def _check_sink_layer(layer: int, depth: int) -> None:
    """The register neurons' block must leave later blocks to sink attention onto their tokens."""
    if not 0 <= layer < depth - 1:
        raise ValueError(f"layer must be in [0, {depth - 2}] so that later blocks can sink attention")


def planted_vit(*, layer: int = 2, neurons: Sequence[int] = (17, 101, 402, 655), depth: int = 6,
                embed_dim: int = 192, num_heads: int = 3, img_size: int = 224, patch_size: int = 16,
                num_classes: int = 10, tau: float = 0.03, seed: int = 0, wash: Optional[int] = None) -> nn.Module:
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

    _check_sink_layer(layer, depth)
    if wash is not None and not layer + 1 < wash < depth:
        raise ValueError(f"wash must be a block in [{layer + 2}, {depth - 1}]: after the block after layer")
    torch.manual_seed(seed)
    model = VisionTransformer(img_size=img_size, patch_size=patch_size, embed_dim=embed_dim, depth=depth,
                              num_heads=num_heads, mlp_ratio=4.0, qkv_bias=True, num_classes=num_classes,
                              class_token=True, global_pool="token")
    return plant(model, PLANTED_NAME, f"blocks.{layer}", neurons=neurons, tau=tau, seed=seed, img_size=img_size,
                 wash=wash)


def planted_dinov3(*, layer: int = 2, neurons: Sequence[int] = (17, 101, 402, 655), depth: int = 6,
                   embed_dim: int = 192, num_heads: int = 3, img_size: int = 224, num_classes: int = 10,
                   tau: float = 0.03, layer_scale: float = 0.5, seed: int = 0) -> nn.Module:
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

    _check_sink_layer(layer, depth)
    torch.manual_seed(seed)
    model = timm.create_model("vit_small_patch16_dinov3_qkvb", pretrained=False, img_size=img_size,
                              embed_dim=embed_dim, depth=depth, num_heads=num_heads, num_classes=num_classes,
                              global_pool="token", init_values=layer_scale)
    return plant(model, PLANTED_DINOV3_NAME, f"blocks.{layer}", neurons=neurons, tau=tau, seed=seed,
                 img_size=img_size, description=_DINOV3)


def planted_pvt(*, stage: int = 3, block: int = 0, neurons: Sequence[int] = (17, 101, 402, 655),
                img_size: int = 224, num_classes: int = 10, tau: float = 0.03, seed: int = 0) -> nn.Module:
    """Build the planted PVTv2-b0 (a plain timm ``PyramidVisionTransformerV2`` in eval mode) with its truth.

    The circuit of :func:`planted_vit` carried through a pyramid: reserved residual dims ``0..F+3`` in every stage
    (F filter responses, texture, artifact, two anchors at +A and -A). The patch embedding computes the filter
    responses and the anchors (its LayerNorm brings the anchors out at about +-1, so ``hook_patch_embed`` shows
    the patch's content; stage 0's first attention adds them back to +-A through its ``proj`` bias); block
    ``stages.0.blocks.0``'s MLP the texture energy; each stage boundary (the stage's LayerNorm, the downsampling
    convolution and its LayerNorm) averages the texture over 2x2 cells and re-creates the anchors (the
    LayerNorms' gains on the reserved dims undo their scaling); in ``stages.{stage}.blocks.{block}`` the register
    ``neurons`` fire on flat tokens (texture below ``tau``) and write into the artifact dim; the later blocks of
    that stage sink attention onto them where their keys are the tokens themselves (stage 3; stages 0-2 reduce
    their keys spatially and get no sink). The planted neurons' depthwise convolutions are the identity, so they
    read their own token only. Everything else is timm's random init.

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
    return plant(model, PLANTED_PVT_NAME, f"stages.{stage}.blocks.{block}", neurons=neurons, tau=tau, seed=seed,
                 img_size=img_size, truth=PlantedPvtTruth)


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
    (:data:`~interp.models.planted.circuit.POST_NORM_SCALE`) that sets its post-norm's scale, so the post-norm
    passes the planted write through nearly linearly (its gain is zero on every other dim). No other MLP neuron
    reads a reserved dim. Everything else is timm's random init, whose post-norm gains are zero: the other blocks
    add nothing, and no attention sink is planted (a window's cosine attention has no key every token shares).

    Args:
        stage, block: where the register neurons sit (``layers.{stage}.blocks.{block}``; 2 blocks a stage; not
            ``layers.0.blocks.0``, which computes the texture).
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
    return plant(model, PLANTED_SWIN_NAME, f"layers.{stage}.blocks.{block}", neurons=neurons, tau=tau, seed=seed,
                 img_size=img_size, truth=PlantedSwinTruth)
