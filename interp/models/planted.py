"""A small ViT with register neurons planted by construction: the ground truth for tests and the demo.

Construction (all other weights are timm's random init with a fixed seed; ``d`` = embed dim):

* Reserved residual dimensions: ``0..F-1`` hold F zero-mean high-pass filter responses of the patch
  (patch embedding rows), ``F`` is the *texture* channel, ``F+1`` the *artifact* channel, ``F+2`` and
  ``F+3`` two anchor channels fixed at ``+A`` and ``-A`` in every token (through ``pos_embed``). The anchors
  make every LayerNorm scale nearly token-independent, and every planted weight row that reads a reserved
  dim also reads the anchors with half its weight and opposite sign, which cancels LayerNorm's mean
  subtraction exactly; so the planted circuit is close to linear.
  Every attention ``proj`` and MLP ``fc2`` has zero rows on the reserved dims, except the planted writes.
* Block 0 MLP computes texture energy ``E = sum_f softabs(filter_f . patch)`` (pairs of GELU neurons
  reading ``+-`` each filter channel; ``softabs`` is about ``|.|``) into the texture channel. A flat patch has ``E = 0``. CLS starts with a large
  texture value so it never triggers.
* Block ``layer`` MLP: the ``neurons`` (register neurons) fire as ``GELU(b * (1 - E / tau))``: about ``b`` on
  flat patches, about 0 on textured ones, and write ``w_out`` each into the artifact channel. From the
  output of that MLP on, flat-patch tokens have a norm several times the others: high-norm tokens that
  emerge in the MLP of ``layer`` (attention there changes nothing).
* Blocks after ``layer``: every head gets a constant query component that meets a key component reading
  the artifact channel, so attention (CLS's included) sinks onto the high-norm tokens from ``layer + 1`` on.

Ground truth (:class:`PlantedTruth`, read with :func:`planted_truth`): the register neurons are ``neurons`` in block ``layer``; the high-norm
tokens are the patches with texture energy below ``tau / 2`` (``truth.artifact_mask(model, images)``);
perfectly flat patches (``E = 0``) always are, strongly textured ones never.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

PLANTED_NAME = "planted_vit"
_TRUTH_ATTR = "_interp_planted_truth"  # where planted_vit keeps the truth on the timm module


@dataclass(frozen=True)
class PlantedTruth:
    """What :func:`planted_vit` planted, in the terms the studies report."""

    layer: int
    neurons: Tuple[int, ...]
    tau: float
    n_filters: int
    texture_dim: int
    artifact_dim: int
    anchor_dims: Tuple[int, int]
    patch_size: int
    gelu_gain: float = 4.0
    description: str = "synthetic ViT with planted register neurons (random weights; not a trained model)"

    def to_dict(self) -> dict:
        return asdict(self)

    def texture_energy(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Per-patch texture energy E [b, h, w] the planted circuit computes from the pixels.

        ``E = sum_f softabs(r_f)``, r_f the patch's response to filter f, ``softabs(r) = (GELU(g r) +
        GELU(-g r)) / g`` with g = ``gelu_gain`` (about |r| for large responses, 0 for flat patches).
        """
        pe = model.patch_embed.proj
        g = self.gelu_gain
        with torch.no_grad():
            resp = nn.functional.conv2d(images.to(pe.weight.dtype), pe.weight[: self.n_filters],
                                        stride=pe.stride)  # [b, F, h, w]
            soft = (nn.functional.gelu(g * resp) + nn.functional.gelu(-g * resp)) / g
        return soft.sum(1)

    def artifact_mask(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Bool [b, h, w]: patches that become high-norm tokens.

        These are the patches with texture energy below ``tau / 2``, where the register neurons fire at
        more than half their full activation (the token norm is then past the middle of the gap between
        ordinary and high-norm tokens).
        """
        return self.texture_energy(model, images) < self.tau / 2


def planted_truth(model: nn.Module) -> Optional[PlantedTruth]:
    """What :func:`planted_vit` planted in ``model`` (a ``HookedViT`` or the timm module), or None for any
    other model.

    >>> truth = planted_truth(interp.load("planted_vit"))
    >>> {truth.layer: list(truth.neurons)}
    {2: [17, 101, 402, 655]}
    """
    module = getattr(model, "timm_model", model)
    truth = getattr(module, _TRUTH_ATTR, None)
    return truth if isinstance(truth, PlantedTruth) else None


def _zero_mean_filters(n: int, patch: int, generator: torch.Generator) -> torch.Tensor:
    """n random filters [n, 3, p, p], zero mean per channel (blind to flat colour), unit L2 norm."""
    f = torch.randn(n, 3, patch, patch, generator=generator)
    f = f - f.mean(dim=(2, 3), keepdim=True)
    return f / f.flatten(1).norm(dim=1).view(n, 1, 1, 1)


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
) -> nn.Module:
    """Build the planted ViT (a plain timm ``VisionTransformer`` in eval mode) with its ground truth.

    Args:
        layer: block whose MLP holds the register neurons (0-indexed); high norms appear after its MLP.
        neurons: indices of the planted register neurons in that MLP (hidden size ``4 * embed_dim``).
        tau: texture energy under which a patch counts as flat (becomes a high-norm token).
        seed: seed of the random weights; the same arguments always give the same weights.

    Returns:
        ``timm.models.vision_transformer.VisionTransformer``; :func:`planted_truth` gives its
        :class:`PlantedTruth`. Wrap it with ``interp.HookedViT.from_timm`` (``interp.load("planted_vit")`` does both).
    """
    from timm.models.vision_transformer import VisionTransformer

    if not 0 <= layer < depth - 1:
        raise ValueError(f"layer must be in [0, {depth - 2}] so that later blocks can sink attention")
    d_mlp = 4 * embed_dim
    neurons = tuple(int(n) for n in neurons)
    n_filters = 8
    if any(not (2 * n_filters <= n < d_mlp) for n in neurons) or len(set(neurons)) != len(neurons):
        raise ValueError(f"neurons must be distinct indices in [{2 * n_filters}, {d_mlp})")

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
        for block in model.blocks[layer + 1:]:
            _plant_attention_sink(block.attn, plan)
    truth = PlantedTruth(layer=layer, neurons=neurons, tau=tau, n_filters=n_filters, texture_dim=plan.tex,
                         artifact_dim=plan.art, anchor_dims=(plan.pos_anchor, plan.neg_anchor),
                         patch_size=patch_size, gelu_gain=plan.gelu_gain)
    setattr(model, _TRUTH_ATTR, truth)
    return model.eval()


_ANCHOR = 100.0  # value of the two anchor channels (+A and -A) in every token


@dataclass(frozen=True)
class _Plan:
    """The reserved residual dims and the constants of the planted circuit (see the module docstring)."""

    n_filters: int
    tau: float
    sigma: float  # LayerNorm scale of an ordinary token: the anchors dominate its spread
    gelu_gain: float = 4.0  # block-0 texture neurons read +-gain*sigma*x so GELU pairs approximate |x|
    fire: float = 6.0  # register-neuron activation on a flat patch
    w_out: float = 25.0  # how much each register neuron writes into the artifact channel
    sink_q: float = 8.0  # constant query component of every head after `layer`

    @property
    def tex(self) -> int:
        return self.n_filters

    @property
    def art(self) -> int:
        return self.n_filters + 1

    @property
    def pos_anchor(self) -> int:
        return self.n_filters + 2

    @property
    def neg_anchor(self) -> int:
        return self.n_filters + 3

    @property
    def reserved(self) -> slice:
        return slice(0, self.n_filters + 4)

    def read(self, row: torch.Tensor, dim: int, weight: float) -> None:
        """Make a weight row read one reserved dim of a LayerNorm output without the token's mean:
        -weight/2 on each anchor (+A and -A) adds back exactly the mean LayerNorm subtracted."""
        row[dim] = weight
        row[self.pos_anchor] = -weight / 2
        row[self.neg_anchor] = -weight / 2


def _plant_inputs(model: nn.Module, plan: _Plan, patch_size: int, generator: torch.Generator) -> None:
    """Filters into the patch embedding, anchors into ``pos_embed``, a textured CLS, and no writes into the
    reserved dims from any attention ``proj`` or MLP ``fc2``."""
    reserved = plan.reserved
    pe = model.patch_embed.proj
    pe.weight[reserved] = 0.0
    pe.bias[reserved] = 0.0
    pe.weight[:plan.n_filters] = _zero_mean_filters(plan.n_filters, patch_size, generator)
    model.pos_embed[..., reserved] = 0.0
    model.pos_embed[..., plan.pos_anchor] = _ANCHOR
    model.pos_embed[..., plan.neg_anchor] = -_ANCHOR
    model.cls_token[..., reserved] = 0.0
    model.cls_token[..., plan.tex] = 10.0 * plan.tau  # CLS never looks flat
    for block in model.blocks:
        block.attn.proj.weight[reserved] = 0.0
        block.attn.proj.bias[reserved] = 0.0
        block.mlp.fc2.weight[reserved] = 0.0
        block.mlp.fc2.bias[reserved] = 0.0


def _plant_texture_neurons(mlp: nn.Module, plan: _Plan) -> None:
    """Block 0's MLP: texture energy (pairs of GELU neurons reading +-each filter) into the texture dim."""
    for f in range(plan.n_filters):
        for sign, n in ((1.0, 2 * f), (-1.0, 2 * f + 1)):
            mlp.fc1.weight[n] = 0.0
            plan.read(mlp.fc1.weight[n], f, sign * plan.gelu_gain * plan.sigma)
            mlp.fc1.bias[n] = 0.0
            mlp.fc2.weight[:, n] = 0.0
            mlp.fc2.weight[plan.tex, n] = 1.0 / plan.gelu_gain


def _plant_register_neurons(mlp: nn.Module, neurons: Sequence[int], plan: _Plan) -> None:
    """The register neurons: fire on flat patches, write into the artifact dim."""
    for n in neurons:
        mlp.fc1.weight[n] = 0.0
        plan.read(mlp.fc1.weight[n], plan.tex, -plan.fire * plan.sigma / plan.tau)
        mlp.fc1.bias[n] = plan.fire
        mlp.fc2.weight[:, n] = 0.0
        mlp.fc2.weight[plan.art, n] = plan.w_out


def _plant_attention_sink(attn: nn.Module, plan: _Plan) -> None:
    """Every head: a constant query component meets a key reading the artifact dim (values ignore it)."""
    qkv, embed_dim = attn.qkv, attn.qkv.in_features
    head_dim = embed_dim // attn.num_heads
    for h in range(attn.num_heads):
        q_row, k_row = h * head_dim, embed_dim + h * head_dim
        qkv.weight[q_row] = 0.0
        qkv.bias[q_row] = plan.sink_q
        qkv.weight[k_row] = 0.0
        plan.read(qkv.weight[k_row], plan.art, 1.0)
        qkv.bias[k_row] = 0.0
    qkv.weight[2 * embed_dim:, plan.art] = 0.0


# ---------------------------------------------------------------------------------------------- DINOv3
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
    if not 0 <= layer < depth - 1:
        raise ValueError(f"layer must be in [0, {depth - 2}] so that later blocks can sink attention")
    d_mlp = 4 * embed_dim
    neurons = tuple(int(n) for n in neurons)
    n_filters = 8
    if any(not (2 * n_filters <= n < d_mlp) for n in neurons) or len(set(neurons)) != len(neurons):
        raise ValueError(f"neurons must be distinct indices in [{2 * n_filters}, {d_mlp})")

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


# ---------------------------------------------------------------------------------------------- planted PVTv2
PLANTED_PVT_NAME = "planted_pvt"


@dataclass(frozen=True)
class PlantedPvtTruth(PlantedTruth):
    """What :func:`planted_pvt` planted: ``layer`` is the flat block index of ``stages.{stage}.blocks.{block}``,
    and the high-norm tokens live on that stage's grid."""

    stage: int = 3
    block: int = 0
    description: str = "synthetic PVTv2-b0 with planted register neurons (random weights; not a trained model)"

    def texture_energy(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Per-token texture energy E [b, h_s, w_s] on the planted stage's grid.

        ``E0 = sum_f softabs(r_f)`` per cell of the patch embedding's grid (r_f: the response to filter f of the
        7x7 stride-4 embedding, zero padding included), then each downsampling to the planted stage averages
        2x2 cells (an odd grid is padded with zeros, flat, first): what the construction computes.
        """
        module = getattr(model, "timm_model", model)
        pe = module.patch_embed.proj
        g = self.gelu_gain
        with torch.no_grad():
            resp = nn.functional.conv2d(images.to(pe.weight.dtype), pe.weight[: self.n_filters], stride=pe.stride,
                                        padding=pe.padding)  # [b, F, h0, w0]
            energy = ((nn.functional.gelu(g * resp) + nn.functional.gelu(-g * resp)) / g).sum(1, keepdim=True)
            for _ in range(self.stage):
                h, w = energy.shape[-2:]
                energy = nn.functional.avg_pool2d(nn.functional.pad(energy, (0, w % 2, 0, h % 2)), 2)
        return energy[:, 0]


def planted_pvt(*, stage: int = 3, block: int = 0, neurons: Sequence[int] = (17, 101, 402, 655),
                img_size: int = 224, num_classes: int = 10, tau: float = 0.03, seed: int = 0) -> nn.Module:
    """Build the planted PVTv2-b0 (a plain timm ``PyramidVisionTransformerV2`` in eval mode) with its truth.

    The circuit of :func:`planted_vit` carried through a pyramid: reserved residual dims ``0..F+3`` in every stage
    (F filter responses, texture, artifact, two anchors at +A and -A). The patch embedding computes the filter
    responses and the anchors; block ``stages.0.blocks.0``'s MLP the texture energy; each stage boundary (the
    stage's LayerNorm, the downsampling convolution and its LayerNorm) averages the texture over 2x2 cells and
    re-creates the anchors (the LayerNorms' gains on the reserved dims undo their scaling); in
    ``stages.{stage}.blocks.{block}`` the register ``neurons`` fire on flat tokens (texture below ``tau``) and write
    into the artifact dim; the later blocks of that stage sink attention onto them. The planted neurons' depthwise
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
    n_filters = 8
    d_mlp = stages[stage].blocks[block].mlp.fc2.in_features
    neurons = tuple(int(n) for n in neurons)
    low = 2 * n_filters if stage == 0 and block == 0 else 0
    if any(not (low <= n < d_mlp) for n in neurons) or len(set(neurons)) != len(neurons):
        raise ValueError(f"neurons must be distinct indices in [{low}, {d_mlp})")
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
            _plant_sr_attention_sink(blk.attn, plans[stage])
    layer = sum(len(s.blocks) for s in stages[:stage]) + block
    truth = PlantedPvtTruth(layer=layer, neurons=neurons, tau=tau, n_filters=n_filters, texture_dim=plans[0].tex,
                            artifact_dim=plans[0].art, anchor_dims=(plans[0].pos_anchor, plans[0].neg_anchor),
                            patch_size=int(model.patch_embed.proj.stride[0]), gelu_gain=plans[0].gelu_gain,
                            stage=stage, block=block)
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


PLANTED_BUILDERS = {PLANTED_NAME: planted_vit, PLANTED_DINOV3_NAME: planted_dinov3,
                    PLANTED_PVT_NAME: planted_pvt}  # name -> builder (interp.load)
