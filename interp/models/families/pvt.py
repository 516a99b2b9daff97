"""The PVTv2 family: timm's ``PyramidVisionTransformerV2`` (``pvt_v2_b0`` .. ``pvt_v2_b5``).

Four stages of blocks on ever coarser grids: an overlapping patch embedding (a 7x7 stride-4 convolution, then
LayerNorm) feeds stage 0; each later stage starts with a 3x3 stride-2 convolution (``stages.{s}.downsample``)
over the previous stage's normed output. Blocks are ``stages.{s}.blocks.{j}``; there is no CLS token and no
position embedding (position enters through the zero padding of the convolutions). Each stage ends with its
own LayerNorm (``stages.{s}.norm``); the last stage's is the model's final norm (``hook_norm_final``) and the
head averages the final tokens (``hook_pooled``: the stand-in where a study needs a global token).

Hook points of one block (prefix ``stages.{s}.blocks.{j}``; t = h_s * w_s tokens of the stage's grid, row-major;
t_k = the keys of the reduced grid; d the stage's width):

* ``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``, ``hook_resid_post`` [b, t, d]:
  as in a ViT (no LayerScale).
* ``attn.hook_q`` [b, t, h, dh]; ``attn.hook_k``, ``attn.hook_v`` [b, t_k, h, dh]: spatial-reduction attention
  reads keys and values from the stage's grid reduced by a ``sr x sr`` stride-``sr`` convolution and a
  LayerNorm (``attn.sr``, ``attn.norm``), so ``t_k = (h_s // sr) * (w_s // sr)`` (``t_k = t`` where
  ``sr = 1``, the last stage). ``attn.hook_attn_scores``, ``attn.hook_pattern`` [b, h, t, t_k]: query ``i`` is
  cell ``(i // w_s, i % w_s)`` of the stage's grid, key ``j`` is cell ``(j // (w_s // sr), j % (w_s // sr))`` of
  the reduced grid, which covers the stage cells ``[r*sr, (r+1)*sr) x [c*sr, (c+1)*sr)`` (:meth:`key_grid`).
  ``attn.hook_z`` [b, t, h, dh].
* ``mlp.hook_pre`` [b, t, d_mlp]: the ``fc1`` output, before the depthwise convolution. ``mlp.hook_post``
  [b, t, d_mlp]: what ``fc2`` reads, ``GELU(dwconv(fc1(x)))`` (the 3x3 depthwise convolution runs over the
  stage's grid); these are the neurons (a neuron = a channel ``fc2`` reads).

Not reproduced (refused by :meth:`PvtV2Family.check`): the linear-SR variant (``pvt_v2_b2_li``: average-pooled
keys and an extra ReLU in the MLP) and models built without pooling (``global_pool=''``).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ...errors import ImageError, InterpError
from ..layout import Grid, TokenLayout
from .base import Family
from .parts import KeyValue, QkvRows, attend, check_blocks, grid_tokens, hook_heads

_ENTRY_POINTS = ("forward_features", "forward_head")


def embed_grid(size: Tuple[int, int]) -> Grid:
    """Grid of the overlapping patch embedding (7x7 kernel, stride 4, padding 3) for an input of ``size``."""
    return tuple((s - 1) // 4 + 1 for s in size)


def downsample_grid(grid: Grid) -> Grid:
    """Grid after a stage's downsampling convolution (3x3 kernel, stride 2, padding 1)."""
    return tuple((g - 1) // 2 + 1 for g in grid)


def _block_problem(block: nn.Module) -> Optional[str]:
    """What else in a PVTv2 block the hooked forward does not reproduce, or None."""
    from timm.models.pvt_v2 import MlpWithDepthwiseConv

    if block.attn.pool is not None:
        return "linear spatial-reduction attention (pvt_v2_*_li)"
    if type(block.mlp) is not MlpWithDepthwiseConv or not isinstance(block.mlp.relu, nn.Identity):
        return "MLP (only MlpWithDepthwiseConv without the linear variant's ReLU)"
    return None


class PvtV2Family(Family):
    name = "pvt_v2"
    stages_attr = "stages"
    title = "timm PyramidVisionTransformerV2 (pvt_v2_b0 .. pvt_v2_b5)"
    timm_modules = ("timm.models.pvt_v2",)
    takes_img_size = False  # any size: an img_size becomes the pretrained_cfg input_size
    extra_tokens_refusal = ("PVTv2 has no prefix tokens and its MLP runs a depthwise convolution over the token "
                            "grid, so a token outside the grid has no place")

    @classmethod
    def timm_class(cls) -> type:
        from timm.models.pvt_v2 import PyramidVisionTransformerV2

        return PyramidVisionTransformerV2

    def check(self) -> None:
        from timm.models.pvt_v2 import Attention, Block, PyramidVisionTransformerV2

        self.refuse_overrides(PyramidVisionTransformerV2, _ENTRY_POINTS)
        if self.module.global_pool != "avg":
            raise self.unsupported(f"global_pool={self.module.global_pool!r} (only 'avg')")
        check_blocks(self, (Block,), (Attention,), _block_problem)

    # ------------------------------------------------------------------ anatomy
    def stage_grids(self, img_size: Optional[Tuple[int, int]] = None) -> Tuple[Grid, ...]:
        """The token grid ``(h, w)`` of every stage for an input of ``img_size`` (default: the model's own)."""
        grid = embed_grid(tuple(img_size) if img_size is not None else self.img_size)
        grids = []
        for stage in self.module.stages:
            if stage.downsample is not None:
                grid = downsample_grid(grid)
            grids.append(grid)
        return tuple(grids)

    def sr_ratio(self, layer: int) -> int:
        """The spatial reduction of block ``layer``'s keys and values (1: none)."""
        sr = self.block(layer).attn.sr
        return 1 if sr is None else int(sr.stride[0])

    def attends_to_tokens(self, layer: int) -> bool:
        return self.sr_ratio(layer) == 1

    def attn_in_proj(self, layer: int) -> QkvRows:
        """``q`` [d, d] over the tokens, ``kv`` [2d, d] (k rows, then v rows) over the spatially reduced grid."""
        attn = self.block(layer).attn
        d, kv_w, kv_b = attn.q.out_features, attn.kv.weight, attn.kv.bias
        return QkvRows(attn.q.weight, attn.q.bias, kv_w[:d], None if kv_b is None else kv_b[:d], kv_w[d:],
                       None if kv_b is None else kv_b[d:])

    def mlp_token_conv(self, layer: int) -> nn.Conv2d:
        """The 3x3 depthwise ``dwconv`` [d_mlp, 1, 3, 3] (padding 1) over the stage's grid."""
        return self.mlp(layer).dwconv

    def stage_norm(self, stage: int) -> nn.Module:
        return self.module.stages[stage].norm

    def downsampling(self, stage: int) -> Optional[Tuple[nn.Module, nn.Module]]:
        """(the 3x3 stride-2 convolution, its LayerNorm) of ``stages.{s}.downsample``; none in stage 0."""
        down = self.module.stages[stage].downsample
        return None if down is None else (down.proj, down.norm)

    def received_attention(self, layer: int, pattern: torch.Tensor,
                           img_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """Per token, as ``Family.received_attention``; refused where the keys are spatially reduced (sr > 1:
        a key is a pooled cell, so no token receives attention of its own)."""
        if self.sr_ratio(layer) != 1:
            raise InterpError(f"block {layer} attends to keys pooled {self.sr_ratio(layer)}x{self.sr_ratio(layer)} "
                              "(spatial reduction): no token receives attention of its own")
        return super().received_attention(layer, pattern, img_size)

    def key_grid(self, layer: int, img_size: Optional[Tuple[int, int]] = None) -> Grid:
        """The grid of block ``layer``'s keys/values (the columns of its ``attn.hook_pattern``): its stage's grid
        divided by the spatial reduction ``sr`` (rounded down). Key cell ``(r, c)`` covers the stage cells
        ``[r*sr, (r+1)*sr) x [c*sr, (c+1)*sr)``."""
        h, w = self.stage_grids(img_size)[self.block_stages()[layer]]
        sr = self.sr_ratio(layer)
        return (h // sr, w // sr)

    def layout(self, img_size: Optional[Tuple[int, int]] = None) -> TokenLayout:
        grids = self.stage_grids(img_size)
        return TokenLayout(n_prefix=0, n_registers=0, cls_index=None, grid=grids[-1], stage_grids=grids,
                           block_stages=self.block_stages())

    @property
    def img_size(self) -> Tuple[int, int]:
        """The (H, W) of the model's pretrained config (PVTv2 itself takes any size, see :meth:`check_input`)."""
        size = getattr(self.module, "pretrained_cfg", {}).get("input_size", (3, 224, 224))
        return (int(size[-2]), int(size[-1]))

    @property
    def patch_size(self) -> Tuple[int, int]:
        """(4, 4): the stride of the overlapping patch embedding (its kernel is 7x7)."""
        return tuple(int(s) for s in self.patch_proj().stride)

    def check_input(self, x: torch.Tensor, model_name: str) -> None:
        """Any (H, W) on which every stage's grid is at least its spatial reduction (the key convolution needs
        one full window)."""
        super().check_input(x, model_name)
        hw = tuple(int(s) for s in x.shape[-2:])
        if not self._fits(hw):
            least = next(s for s in range(1, 4097) if self._fits((s, s)))
            raise ImageError(f"model {model_name} needs images of at least {least}x{least} px (each stage's grid "
                             f"must cover its key reduction), got {hw[0]}x{hw[1]}")

    def _fits(self, hw: Tuple[int, int]) -> bool:
        grids, stages = self.stage_grids(hw), self.block_stages()
        return all(min(grids[stages[i]]) >= self.sr_ratio(i) for i in range(len(stages)))

    # ------------------------------------------------------------------ hooked forward
    def residual_stream(self, hooked, x: torch.Tensor, n_blocks: Optional[int] = None) -> torch.Tensor:
        """timm's ``forward_features`` without the last stage's norm: stage by stage, each stage's blocks on its
        grid, the stage norm and the next stage's downsampling between stages."""
        m = self.module
        n_blocks = len(self.blocks()) if n_blocks is None else n_blocks
        state, force = hooked.edit_state, hooked.force_patterns
        tokens, (h, w) = grid_tokens(m.patch_embed(x))
        tokens = hooked.hook_embed(hooked.hook_patch_embed(tokens))
        if n_blocks == 0:
            return tokens
        layer = 0
        for s, stage in enumerate(m.stages):
            if s > 0:
                grid_map = tokens.reshape(tokens.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()
                tokens, (h, w) = grid_tokens(stage.downsample(grid_map))
            for block in stage.blocks:
                tokens = block_forward(block, tokens, (h, w), state.extra_kv.get(layer), force)
                layer += 1
                if layer == n_blocks:
                    return tokens
            tokens = stage.norm(tokens)
        return tokens

    def forward_features(self, hooked, x: torch.Tensor) -> torch.Tensor:
        """Images -> the last stage's normed tokens [b, t, d] (timm returns them as a [b, d, h, w] map)."""
        return hooked.hook_norm_final(self.module.stages[-1].norm(self.residual_stream(hooked, x)))

    def forward_head(self, hooked, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """timm's order: the mean of the tokens (or a pooling override), ``head_drop`` (-> ``hook_pooled``),
        ``head`` (-> ``hook_logits``)."""
        m, state = self.module, hooked.edit_state
        if state.pool_override is not None:
            pooled, votes = state.pool_override(tokens)
            if votes is not None:
                hooked.hook_selective_votes(votes)
        else:
            pooled = tokens.mean(dim=1)
        pooled = hooked.hook_pooled(m.head_drop(pooled))
        return pooled if pre_logits else hooked.hook_logits(m.head(pooled))

    # ------------------------------------------------------------------ plain timm models
    def plain_mlp_edits(self, layer: int, edits: Sequence[nn.Module]) -> None:
        mlp = self.mlp(layer)
        mlp.act = ActivationThenEdits(mlp.act, edits)

    def plain_extra_kv(self, layer: int, kv: KeyValue) -> None:
        block = self.block(layer)
        block.attn = SrAttentionWithExtraKV(block.attn, *kv)

    def describe(self) -> dict:
        return {"family": self.name, "stages": len(self.module.stages),
                "sr_ratios": [self.sr_ratio(i) for i in range(len(self.blocks()))]}


def attention_forward(attn: nn.Module, x: torch.Tensor, grid: Grid, extra_kv: Optional[KeyValue] = None,
                      force_pattern: bool = False, hooked: bool = True) -> torch.Tensor:
    """Hooked forward of ``timm.models.pvt_v2.Attention`` (spatial-reduction attention), op for op.

    Args:
        x: [b, t, d] normed residual stream of a stage whose grid is ``grid`` (h, w), t = h * w.
        extra_kv: optional (k', v'), each [h, m, dh], appended as m extra key/value columns.
        hooked: False for a plain module without hook points.

    Returns:
        [b, t, d] attention output (after ``proj``).
    """
    B, N, C = x.shape
    H, W = grid
    q = attn.q(x).reshape(B, N, attn.num_heads, -1).permute(0, 2, 1, 3)  # [b, h, t, dh]
    if attn.sr is not None:
        x = attn.sr(x.permute(0, 2, 1).reshape(B, C, H, W)).reshape(B, C, -1).permute(0, 2, 1)
        x = attn.norm(x)  # [b, t_k, d]
    kv = attn.kv(x).reshape(B, -1, 2, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    k, v = kv.unbind(0)  # each [b, h, t_k, dh]
    if hooked:
        q, k, v = hook_heads(attn.hook_q, q), hook_heads(attn.hook_k, k), hook_heads(attn.hook_v, v)
    z = attend(attn, q, k, v, extra_kv, force_pattern, hooked)  # [b, t, h, dh]
    return attn.proj_drop(attn.proj(z.reshape(B, N, C)))


def mlp_forward(mlp: nn.Module, x: torch.Tensor, grid: Grid) -> torch.Tensor:
    """Hooked forward of ``timm.models.pvt_v2.MlpWithDepthwiseConv``: ``fc1`` (-> ``hook_pre``), the 3x3
    depthwise convolution over the grid, GELU (-> ``hook_post``, the neurons), ``fc2``. x: [b, t, d]."""
    h = mlp.hook_pre(mlp.fc1(x))
    B, N, C = h.shape
    h = mlp.dwconv(mlp.relu(h.transpose(1, 2).view(B, C, grid[0], grid[1])))
    h = mlp.hook_post(mlp.act(h.flatten(2).transpose(1, 2)))
    return mlp.drop(mlp.fc2(mlp.drop(h)))


def block_forward(block: nn.Module, x: torch.Tensor, grid: Grid, extra_kv: Optional[KeyValue] = None,
                  force_pattern: bool = False) -> torch.Tensor:
    """Hooked forward of ``timm.models.pvt_v2.Block``. x: [b, t, d] on ``grid`` -> [b, t, d]."""
    resid_pre = block.hook_resid_pre(x)
    attn_out = block.hook_attn_out(attention_forward(block.attn, block.norm1(resid_pre), grid, extra_kv,
                                                     force_pattern))
    resid_mid = block.hook_resid_mid(resid_pre + block.drop_path1(attn_out))
    mlp_out = block.hook_mlp_out(mlp_forward(block.mlp, block.norm2(resid_mid), grid))
    return block.hook_resid_post(resid_mid + block.drop_path2(mlp_out))


class ActivationThenEdits(nn.Module):
    """Stand-in for a plain PVTv2 MLP's ``act``: the activation, then ``edits`` in order (what ``fc2`` reads is
    edited; timm's ``drop`` after it is shared with the output, so it cannot carry the edits)."""

    def __init__(self, act: nn.Module, edit_modules: Sequence[nn.Module]):
        super().__init__()
        self.act = act
        self.edits = nn.ModuleList(edit_modules)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.act(h)
        for edit in self.edits:
            h = edit(h)
        return h


class SrAttentionWithExtraKV(nn.Module):
    """Stand-in for a plain PVTv2 ``Attention`` that appends (k', v') [h, m, dh] as extra key/value columns: the
    hooked arithmetic without hook points; it adopts the original's children under the same names, so the
    block's ``state_dict`` keys are unchanged."""

    def __init__(self, attn: nn.Module, k_extra: torch.Tensor, v_extra: torch.Tensor):
        super().__init__()
        for name in ("q", "kv", "sr", "norm", "attn_drop", "proj", "proj_drop"):
            child = getattr(attn, name)
            if child is None:
                setattr(self, name, None)
            else:
                self.add_module(name, child)
        self.num_heads, self.head_dim, self.scale = attn.num_heads, attn.head_dim, attn.scale
        self.register_buffer("k_extra", k_extra.detach().clone(), persistent=False)
        self.register_buffer("v_extra", v_extra.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor, feat_size: List[int]) -> torch.Tensor:
        return attention_forward(self, x, tuple(feat_size), (self.k_extra, self.v_extra), hooked=False)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, extra_columns={self.k_extra.shape[1]}"
