"""The planted circuit, in parts that plant it into timm modules: reserved residual dims (:class:`Plan`), the
patch embedding's filters and anchors, texture and register neurons, attention sinks, stage boundaries.

Each part takes the layers and tensors it writes (an MLP's input and output linears, an attention's
:class:`~interp.models.families.parts.QkvRows`, a norm, a downsampling's projection) and writes the same circuit
whatever the family; :func:`~interp.models.planted.plant.plant` finds them through the family adapter's accessors
(it reads no timm attribute itself) and calls the parts in order. All writes are in place and must run under
``torch.no_grad()``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from ..families.parts import QkvRows

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


def plant_embedding(proj: nn.Conv2d, norm: Optional[nn.Module], prefix: Sequence[torch.Tensor],
                    table: Optional[torch.Tensor], plan: Plan, generator: torch.Generator) -> None:
    """Filters into the patch embedding's convolution ``proj`` [d, 3, p, p], anchors into every token, textured
    prefix tokens (``prefix``: CLS [1, 1, d], registers [1, r, d]); ``table`` the absolute position table
    [1, t, d] or None, ``norm`` the norm on the embedding's output or None.

    The anchors enter through the absolute position embedding where the model has one (it covers the prefix
    tokens), else through the embedding's bias and the prefix tokens (CLS, registers) themselves. Where the
    embedding has a LayerNorm (the pyramids), its outputs sum to zero (:func:`absorb_sum`), the filter responses
    keep their scale and the anchors come out at about +-1 (``hook_patch_embed`` shows the patch's content, not
    the anchors, so neighbour similarity means something); the first block adds them back to +-A.
    """
    reserved, prefix = plan.reserved, list(prefix)
    proj.weight[reserved] = 0.0
    proj.bias[reserved] = 0.0
    proj.weight[:plan.n_filters] = zero_mean_filters(plan.n_filters, proj.kernel_size[0], generator)
    for tensor in prefix + ([table] if table is not None else []):
        tensor[..., reserved] = 0.0
    for tensor in [table] if table is not None else [proj.bias] + prefix:
        tensor[..., plan.pos_anchor] = ANCHOR
        tensor[..., plan.neg_anchor] = -ANCHOR
    for token in prefix:
        token[..., plan.tex] = 10.0 * plan.tau  # prefix tokens never look flat
    if isinstance(norm, nn.LayerNorm):
        absorb_sum(proj.weight, proj.bias, plan)  # (then restore_anchors in the first block)
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


def plant_boundary(proj: nn.Module, norm: nn.LayerNorm, before: Plan, after: Plan) -> None:
    """A stage boundary (a downsampling's projection ``proj`` and its ``norm``): the texture averaged over the 2x2
    cells each output token covers, the anchors re-created, the other reserved dims 0, the norm's gains undoing
    its scaling on the reserved dims.

    Two kinds: a strided convolution (PVTv2's, 3x3 stride 2 padding 1: its taps (1, 1), (1, 2), (2, 1), (2, 2);
    its input is the previous stage norm's output, ``x - mean`` on the reserved dims, which the anchors cancel;
    the anchors come from its bias) or a patch merging's linear (Swin's, over the 4 concatenated neighbours: the
    raw residual; the anchors are the mean of the input anchors, and its outputs sum to zero
    (:func:`absorb_sum`)).
    """
    if isinstance(proj, nn.Linear):
        red = proj
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
        conv = proj
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
    restore_scale(norm, after)


def restore_anchors(bias: torch.Tensor, plan: Plan) -> None:
    """The bias of the first block's attention branch brings the anchors back to +-A (they leave a normed patch
    embedding at about +-1, :func:`plant_embedding`)."""
    bias[plan.pos_anchor] = ANCHOR - 1.0
    bias[plan.neg_anchor] = -(ANCHOR - 1.0)


def own_token_only(conv: Optional[nn.Conv2d], neurons: Sequence[int]) -> None:
    """Where the MLP runs a 3x3 depthwise convolution ``conv`` over the grid (PVTv2; None: none), it passes these
    neurons through unchanged, so each reads its own token only."""
    if conv is None:
        return
    for n in neurons:
        conv.weight[n] = 0.0
        conv.weight[n, 0, 1, 1] = 1.0
        conv.bias[n] = 0.0


LAYER_SCALE_GAIN = 5.0  # LayerScale on the artifact dim of the register neurons' block: fc2 writes w_out / gain


def plant_texture_neurons(fc_in: nn.Linear, fc_out: nn.Linear, plan: Plan) -> None:
    """Block 0's MLP (its input linear [d_mlp, d], output linear [d, d_mlp]): texture energy (pairs of GELU neurons
    reading +-each filter) into the texture dim."""
    for f in range(plan.n_filters):
        for sign, n in ((1.0, 2 * f), (-1.0, 2 * f + 1)):
            fc_in.weight[n] = 0.0
            plan.read(fc_in.weight[n], f, sign * plan.gelu_gain * plan.scale)
            fc_in.bias[n] = 0.0
            fc_out.weight[:, n] = 0.0
            fc_out.weight[plan.tex, n] = 1.0 / plan.gelu_gain


def plant_register_neurons(fc_in: nn.Linear, fc_out: nn.Linear, neurons: Sequence[int], plan: Plan) -> None:
    """The register neurons of an MLP (its input and output linears): fire as ``GELU(fire (1 - E / tau))`` on flat
    patches, write into the artifact dim."""
    for n in neurons:
        fc_in.weight[n] = 0.0
        plan.read(fc_in.weight[n], plan.tex, -plan.fire * plan.scale / plan.tau)
        fc_in.bias[n] = plan.fire
        fc_out.weight[:, n] = 0.0
        fc_out.weight[plan.art, n] = plan.w_out


POST_NORM_SCALE = 1e4  # the constant channel of a planted post-norm MLP's output (see linear_post_norm)


def linear_post_norm(fc_out: nn.Linear, norm: nn.LayerNorm, dim: int) -> None:
    """A post-norm block's MLP (its output linear ``fc_out`` [d, d_mlp]) writes only through ``dim``: its output is
    the planted write plus a constant channel (the last one, :data:`POST_NORM_SCALE`) that sets the norm's scale,
    and the norm passes the write through (gain and bias undo the normalisation at the constant's scale) and
    nothing else; the other columns of ``fc_out`` must be 0 (the planted ones are set after zeroing them)."""
    width = fc_out.out_features
    fc_out.bias.zero_()
    fc_out.bias[width - 1] = POST_NORM_SCALE
    norm.weight.zero_()
    norm.bias.zero_()
    norm.weight[dim] = POST_NORM_SCALE / math.sqrt(width - 1)  # LN of (v e_dim + S e_last) is about ...
    norm.bias[dim] = POST_NORM_SCALE / (width - 1)  # ... v sqrt(w-1) / S - 1 / sqrt(w-1): back to v


def plant_attention_sink(rows: QkvRows, n_heads: int, plan: Plan, dim: int = 0, rope_partner: bool = False) -> None:
    """Every head of an attention (its input projections ``rows``, ``n_heads`` heads): a constant query component
    on head dim ``dim`` meets a key component there reading the artifact dim; values ignore the artifact dim. With
    ``rope_partner`` (RoPE in the half layout) the dim's rotation partner ``dim + head_dim / 2`` is zeroed in q and
    k, so the rotation only scales the pair by the cos of a small angle (``dim``: :func:`steadiest_rope_dim`)."""
    q_w, q_b, k_w, k_b, v_w = rows.q_weight, rows.q_bias, rows.k_weight, rows.k_bias, rows.v_weight
    head_dim = q_w.shape[0] // n_heads
    for h in range(n_heads):
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


def steadiest_rope_dim(rope: torch.Tensor) -> int:
    """The head dim j < head_dim / 2 whose RoPE angle varies least over the patches of the RoPE table ``rope``
    [n_patches, 2 * head_dim] (sines, then cosines: :meth:`~interp.models.families.positions.Positions.rope_embed`;
    RoPE rotates the pair (j, j + head_dim / 2) of each head in DINOv3's half layout)."""
    sin, _ = rope.tensor_split(2, dim=-1)  # [n_patches, head_dim] each
    half = sin.shape[-1] // 2
    return int(sin[:, :half].abs().amax(dim=0).argmin())


def checked_neurons(neurons: Sequence[int], d_mlp: int, low: int) -> Tuple[int, ...]:
    """``neurons`` as ints, refused unless distinct and in ``[low, d_mlp)`` (below ``low``: the texture neurons)."""
    neurons = tuple(int(n) for n in neurons)
    if any(not (low <= n < d_mlp) for n in neurons) or len(set(neurons)) != len(neurons):
        raise ValueError(f"neurons must be distinct indices in [{low}, {d_mlp})")
    return neurons
