"""The planted circuit, in parts that plant it into timm modules: reserved residual dims (:class:`Plan`), the
patch embedding's filters and anchors, texture and register neurons, attention sinks, stage boundaries.

Each part takes the modules it writes (a block's ``attn`` or ``mlp``, a norm, a downsampling) and writes the
same circuit whatever the family; :func:`~interp.models.planted.plant.plant` finds those modules through the
family adapter and calls the parts in order. All writes are in place and must run under ``torch.no_grad()``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

N_FILTERS = 8  # zero-mean filters whose responses make the texture energy (reserved dims 0..F-1)
ANCHOR = 100.0  # value of the two anchor channels (+A and -A) in every token


@dataclass(frozen=True)
class Plan:
    """The reserved residual dims of one residual width and the constants of the planted circuit (see the
    package docstring)."""

    n_filters: int
    tau: float
    sigma: float  # LayerNorm scale of an ordinary token: the anchors dominate its spread
    normed: bool = True  # planted neurons read a LayerNorm's output (pre-norm block), else the raw residual
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

    @property
    def scale(self) -> float:
        """What a reading weight is multiplied by: ``sigma`` where it reads a LayerNorm's output (undoing the
        normalisation), 1 where it reads the raw residual."""
        return self.sigma if self.normed else 1.0

    def read(self, row: torch.Tensor, dim: int, weight: float) -> None:
        """Make a weight row read one reserved dim. Where it reads a LayerNorm's output (``normed``), -weight/2 on
        each anchor (+A and -A) adds back exactly the mean LayerNorm subtracted; the raw residual lost none."""
        row[dim] = weight
        if self.normed:
            row[self.pos_anchor] = -weight / 2
            row[self.neg_anchor] = -weight / 2


def zero_mean_filters(n: int, patch: int, generator: torch.Generator) -> torch.Tensor:
    """n random filters [n, 3, p, p], zero mean per channel (blind to flat colour), unit L2 norm."""
    f = torch.randn(n, 3, patch, patch, generator=generator)
    f = f - f.mean(dim=(2, 3), keepdim=True)
    return f / f.flatten(1).norm(dim=1).view(n, 1, 1, 1)


def restore_scale(norm: nn.LayerNorm, plan: Plan) -> None:
    """A LayerNorm whose reserved dims keep the scale of its input (gain = the anchors' spread, bias 0)."""
    norm.weight[plan.reserved] = plan.sigma
    norm.bias[plan.reserved] = 0.0


def absorb_sum(weight: torch.Tensor, bias: Optional[torch.Tensor], plan: Plan) -> None:
    """The output channels past the reserved ones absorb the sum over all channels, so that the outputs sum to
    zero for every input: the LayerNorm after them subtracts no mean (its gains on the reserved dims may then
    differ). ``weight`` [out, ...], ``bias`` [out] or None."""
    others = [c for c in range(weight.shape[0]) if c >= plan.reserved.stop]
    weight[others] -= weight.sum(0, keepdim=True) / len(others)
    if bias is not None:
        bias[others] -= bias.sum() / len(others)


def plant_embedding(module: nn.Module, plan: Plan, generator: torch.Generator) -> None:
    """Filters into the patch embedding (``patch_embed.proj``), anchors into every token, textured prefix tokens.

    The anchors enter through the absolute position embedding where the model has one (it covers the prefix
    tokens), else through the embedding's bias and the prefix tokens (CLS, registers) themselves. Where the
    embedding has a LayerNorm (the pyramids), its outputs sum to zero (:func:`absorb_sum`), the filter responses
    keep their scale and the anchors come out at about +-1 (``hook_patch_embed`` shows the patch's content, not
    the anchors, so neighbour similarity means something); the first block adds them back to +-A.
    """
    reserved, pe = plan.reserved, module.patch_embed.proj
    pe.weight[reserved] = 0.0
    pe.bias[reserved] = 0.0
    pe.weight[:plan.n_filters] = zero_mean_filters(plan.n_filters, pe.kernel_size[0], generator)
    pos = getattr(module, "pos_embed", None)
    prefix = [t for t in (getattr(module, "cls_token", None), getattr(module, "reg_token", None)) if t is not None]
    for tensor in prefix + ([pos] if pos is not None else []):
        tensor[..., reserved] = 0.0
    for tensor in [pos] if pos is not None else [pe.bias] + prefix:
        tensor[..., plan.pos_anchor] = ANCHOR
        tensor[..., plan.neg_anchor] = -ANCHOR
    for token in prefix:
        token[..., plan.tex] = 10.0 * plan.tau  # prefix tokens never look flat
    norm = getattr(module.patch_embed, "norm", None)
    if isinstance(norm, nn.LayerNorm):
        absorb_sum(pe.weight, pe.bias, plan)  # (then restore_anchors in the first block)
        restore_scale(norm, plan)
        norm.weight[[plan.pos_anchor, plan.neg_anchor]] = plan.sigma / ANCHOR  # anchors out at about +-1


def protect_reserved(plan: Plan, *writers: nn.Linear, gains: Sequence[Optional[torch.Tensor]] = ()) -> None:
    """No write into the reserved dims from these layers (a pre-norm block's attention ``proj`` and MLP ``fc2``),
    and LayerScale ``gains`` [d] (None: none) 1 on them."""
    for layer in writers:
        layer.weight[plan.reserved] = 0.0
        layer.bias[plan.reserved] = 0.0
    for gain in gains:
        if gain is not None:
            gain[plan.reserved] = 1.0


def plant_boundary(downsample: nn.Module, before: Plan, after: Plan) -> None:
    """A stage boundary: the texture averaged over the 2x2 cells each output token covers, the anchors
    re-created, the other reserved dims 0, its LayerNorm's gains undoing its scaling on the reserved dims.

    Two kinds: a strided convolution (PVTv2's ``downsample.proj``, 3x3 stride 2 padding 1: its taps (1, 1),
    (1, 2), (2, 1), (2, 2); its input is the previous stage norm's output, ``x - mean`` on the reserved dims,
    which the anchors cancel; the anchors come from its bias) or a patch merging (Swin's ``downsample.reduction``
    over the 4 concatenated neighbours: the raw residual; the anchors are the mean of the input anchors, and its
    outputs sum to zero (:func:`absorb_sum`)).
    """
    if hasattr(downsample, "reduction"):
        red = downsample.reduction
        width = red.in_features // 4
        for j in range(4):
            red.weight[:, j * width + before.reserved.start:j * width + before.reserved.stop] = 0.0
        red.weight[after.reserved] = 0.0
        for j in range(4):
            red.weight[after.tex, j * width + before.tex] = 0.25
            red.weight[after.pos_anchor, j * width + before.pos_anchor] = 0.25
            red.weight[after.neg_anchor, j * width + before.neg_anchor] = 0.25
        absorb_sum(red.weight, None, after)
    else:
        conv = downsample.proj
        conv.weight[:, before.reserved] = 0.0  # its input's reserved dims keep the anchors' scale: read by nothing else
        conv.weight[after.reserved] = 0.0
        conv.bias[after.reserved] = 0.0
        for i in (1, 2):
            for j in (1, 2):
                conv.weight[after.tex, before.tex, i, j] = 0.25
                conv.weight[after.tex, before.pos_anchor, i, j] = -0.125
                conv.weight[after.tex, before.neg_anchor, i, j] = -0.125
        conv.bias[after.pos_anchor] = ANCHOR
        conv.bias[after.neg_anchor] = -ANCHOR
    restore_scale(downsample.norm, after)


def restore_anchors(bias: torch.Tensor, plan: Plan) -> None:
    """The bias of the first block's attention branch brings the anchors back to +-A (they leave a normed patch
    embedding at about +-1, :func:`plant_embedding`)."""
    bias[plan.pos_anchor] = ANCHOR - 1.0
    bias[plan.neg_anchor] = -(ANCHOR - 1.0)


def own_token_only(mlp: nn.Module, neurons: Sequence[int]) -> None:
    """Where the MLP runs a depthwise convolution over the grid (PVTv2), it passes these neurons through
    unchanged, so each reads its own token only."""
    if getattr(mlp, "dwconv", None) is None:
        return
    for n in neurons:
        mlp.dwconv.weight[n] = 0.0
        mlp.dwconv.weight[n, 0, 1, 1] = 1.0
        mlp.dwconv.bias[n] = 0.0


LAYER_SCALE_GAIN = 5.0  # LayerScale on the artifact dim of the register neurons' block: fc2 writes w_out / gain


def plant_texture_neurons(mlp: nn.Module, plan: Plan) -> None:
    """Block 0's MLP: texture energy (pairs of GELU neurons reading +-each filter) into the texture dim."""
    for f in range(plan.n_filters):
        for sign, n in ((1.0, 2 * f), (-1.0, 2 * f + 1)):
            mlp.fc1.weight[n] = 0.0
            plan.read(mlp.fc1.weight[n], f, sign * plan.gelu_gain * plan.scale)
            mlp.fc1.bias[n] = 0.0
            mlp.fc2.weight[:, n] = 0.0
            mlp.fc2.weight[plan.tex, n] = 1.0 / plan.gelu_gain


def plant_register_neurons(mlp: nn.Module, neurons: Sequence[int], plan: Plan) -> None:
    """The register neurons: fire as ``GELU(fire (1 - E / tau))`` on flat patches, write into the artifact dim."""
    for n in neurons:
        mlp.fc1.weight[n] = 0.0
        plan.read(mlp.fc1.weight[n], plan.tex, -plan.fire * plan.scale / plan.tau)
        mlp.fc1.bias[n] = plan.fire
        mlp.fc2.weight[:, n] = 0.0
        mlp.fc2.weight[plan.art, n] = plan.w_out


POST_NORM_SCALE = 1e4  # the constant channel of a planted post-norm MLP's output (see linear_post_norm)


def linear_post_norm(mlp: nn.Module, norm: nn.LayerNorm, dim: int) -> None:
    """A post-norm block's MLP writes only through ``dim``: its output is the planted write plus a constant
    channel (the last one, :data:`POST_NORM_SCALE`) that sets the norm's scale, and the norm passes the write
    through (gain and bias undo the normalisation at the constant's scale) and nothing else; its other ``fc2``
    columns must be 0 (the planted ones are set after zeroing them)."""
    width = mlp.fc2.out_features
    mlp.fc2.bias.zero_()
    mlp.fc2.bias[width - 1] = POST_NORM_SCALE
    norm.weight.zero_()
    norm.bias.zero_()
    norm.weight[dim] = POST_NORM_SCALE / math.sqrt(width - 1)  # LN of (v e_dim + S e_last) is about ...
    norm.bias[dim] = POST_NORM_SCALE / (width - 1)  # ... v sqrt(w-1) / S - 1 / sqrt(w-1): back to v


def qk_rows(attn: nn.Module) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Views (q weight [d, d_in], q bias [d], k weight, k bias or None, v weight) of an attention's projections:
    a fused ``qkv`` (with EVA's separate ``q_bias``) or PVTv2's ``q`` and ``kv``."""
    if getattr(attn, "kv", None) is not None:
        d = attn.q.out_features
        return attn.q.weight, attn.q.bias, attn.kv.weight[:d], attn.kv.bias[:d], attn.kv.weight[d:]
    qkv = attn.qkv
    d = qkv.out_features // 3
    q_bias = getattr(attn, "q_bias", None)
    if q_bias is not None:  # EVA: its k bias is a fixed zero buffer
        return qkv.weight[:d], q_bias, qkv.weight[d:2 * d], None, qkv.weight[2 * d:]
    return qkv.weight[:d], qkv.bias[:d], qkv.weight[d:2 * d], qkv.bias[d:2 * d], qkv.weight[2 * d:]


def plant_attention_sink(attn: nn.Module, plan: Plan, dim: int = 0, rope_partner: bool = False) -> None:
    """Every head: a constant query component on head dim ``dim`` meets a key component there reading the
    artifact dim; values ignore the artifact dim. With ``rope_partner`` (RoPE in the half layout) the dim's
    rotation partner ``dim + head_dim / 2`` is zeroed in q and k, so the rotation only scales the pair by the cos
    of a small angle (``dim``: :func:`steadiest_rope_dim`)."""
    q_w, q_b, k_w, k_b, v_w = qk_rows(attn)
    head_dim = q_w.shape[0] // attn.num_heads
    for h in range(attn.num_heads):
        row = h * head_dim + dim
        q_w[row] = 0.0
        q_b[row] = plan.sink_q
        k_w[row] = 0.0
        plan.read(k_w[row], plan.art, 1.0)
        if k_b is not None:
            k_b[row] = 0.0
        if rope_partner:
            partner = row + head_dim // 2
            q_w[partner] = 0.0
            k_w[partner] = 0.0
            q_b[partner] = 0.0
    v_w[:, plan.art] = 0.0


def steadiest_rope_dim(module: nn.Module, grid: Tuple[int, int]) -> int:
    """The head dim j < head_dim / 2 whose RoPE angle varies least over the patch ``grid`` (RoPE rotates the pair
    (j, j + head_dim / 2) of each head in DINOv3's half layout)."""
    sin, _ = module.rope.get_embed(shape=grid).tensor_split(2, dim=-1)  # [n_patches, head_dim] each
    half = sin.shape[-1] // 2
    return int(sin[:, :half].abs().amax(dim=0).argmin())


def checked_neurons(neurons: Sequence[int], d_mlp: int, low: int) -> Tuple[int, ...]:
    """``neurons`` as ints, refused unless distinct and in ``[low, d_mlp)`` (below ``low``: the texture neurons)."""
    neurons = tuple(int(n) for n in neurons)
    if any(not (low <= n < d_mlp) for n in neurons) or len(set(neurons)) != len(neurons):
        raise ValueError(f"neurons must be distinct indices in [{low}, {d_mlp})")
    return neurons
