"""The planted circuit shared by every planted model: its ground truth (:class:`PlantedTruth`) and the parts
that plant it (reserved residual dims, texture and register neurons, attention sinks)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

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
    washed_at: Optional[int] = None  # the block whose MLP writes the artifacts out again (planted_vit(wash=...))

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


@dataclass(frozen=True)
class PlantedPyramidTruth(PlantedTruth):
    """What a planted pyramid (``planted_pvt``, ``planted_swin``) planted: ``layer`` is the flat block index of
    block ``block`` of stage ``stage``, and the high-norm tokens live on that stage's grid."""

    stage: int = 3
    block: int = 0

    def texture_energy(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Per-token texture energy E [b, h_s, w_s] on the planted stage's grid: ``E0 = sum_f softabs(r_f)`` per
        cell of the patch embedding's grid (r_f: the response to filter f of the embedding convolution, its zero
        padding included), then every downsampling to the planted stage averages 2x2 cells (an odd grid padded
        with zeros first, as timm pads): what the construction computes."""
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


N_FILTERS = 8  # zero-mean filters whose responses make the texture energy (reserved dims 0..F-1)


def check_sink_layer(layer: int, depth: int) -> None:
    """The register neurons' block must leave later blocks to sink attention onto their tokens."""
    if not 0 <= layer < depth - 1:
        raise ValueError(f"layer must be in [0, {depth - 2}] so that later blocks can sink attention")


def checked_neurons(neurons: Sequence[int], d_mlp: int, low: int) -> Tuple[int, ...]:
    """``neurons`` as ints, refused unless distinct and in ``[low, d_mlp)`` (below ``low``: the texture neurons)."""
    neurons = tuple(int(n) for n in neurons)
    if any(not (low <= n < d_mlp) for n in neurons) or len(set(neurons)) != len(neurons):
        raise ValueError(f"neurons must be distinct indices in [{low}, {d_mlp})")
    return neurons
