"""The Swin-v2 family: timm's ``SwinTransformerV2`` (``swinv2_tiny_window8_256`` .. ``swinv2_large_*``; not the
``swinv2_cr_*`` models, another class).

Stages (``layers.{s}``) of blocks on ever coarser grids: a 4x4 patch embedding (then LayerNorm) feeds stage 0;
each later stage starts with patch merging (``layers.{s}.downsample``: 2x2 neighbours concatenated, a linear
reduction, LayerNorm). Blocks are ``layers.{s}.blocks.{j}``; there is no CLS token and no position embedding.
The model's final LayerNorm (``norm``) gives ``hook_norm_final``; the head averages the final tokens
(``hook_pooled``: the stand-in where a study needs a global token).

A block is residual post-norm: ``x + norm1(attn(x))``, then ``x + norm2(mlp(x))``. Attention runs inside
windows of ``ws x ws`` tokens of the stage's grid; every odd block of a stage first rolls the grid by
``(-shift, -shift)`` (``shift = ws // 2``) and masks out the pairs that the roll brought together. Scores are
cosine similarities of q and k times a learned per-head scale (``exp(min(logit_scale, log 100))``) plus a
continuous position bias (``16 * sigmoid(cpb_mlp(relative coords))``) plus that mask (-100 on masked pairs).

Hook points of one block (prefix ``layers.{s}.blocks.{j}``; t = h_s * w_s tokens of the stage's grid, row-major;
n_w windows per image, N = ws * ws tokens per window; d the stage's width):

* ``hook_resid_pre``, ``hook_resid_mid``, ``hook_resid_post`` [b, t, d]: the residual stream.
* ``hook_attn_out``, ``hook_mlp_out`` [b, t, d]: what each branch adds to the residual stream, after its
  post-norm (``norm1(attn(x))``, ``norm2(mlp(x))``).
* In window coordinates: ``attn.hook_q``, ``attn.hook_k``, ``attn.hook_v``, ``attn.hook_z`` [b, n_w, N, h, dh]
  (q and k before their normalisation); ``attn.hook_attn_scores``, ``attn.hook_pattern`` [b, n_w, h, N, N]
  (scores: the logits with the position bias and the shift mask). Window ``w`` and slot ``n`` hold the token
  :meth:`SwinV2Family.window_tokens` ``[w, n]`` of the stage's grid (row-major index; -1 for padding where the
  grid is not a multiple of ``ws``): the windows tile the grid rolled by ``-shift``, row-major over windows and
  within each window.
* ``mlp.hook_pre`` [b, t, 4d] (``fc1``), ``mlp.hook_post`` [b, t, 4d] (after GELU: what ``fc2`` reads, the
  neurons).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ImageError
from ..layout import Grid, TokenLayout
from .base import Family
from .parts import MlpActivationEdits, check_blocks, grid_tokens, mlp_forward

_ENTRY_POINTS = ("forward_features", "forward_head")


class SwinV2Family(Family):
    name = "swinv2"
    stages_attr = "layers"
    title = "timm SwinTransformerV2 (swinv2_*, not swinv2_cr_*)"
    timm_modules = ("timm.models.swin_transformer_v2",)
    extra_tokens_refusal = ("Swin-v2 has no prefix tokens and attends inside windows of the token grid, so a token "
                            "outside the grid belongs to no window")
    extra_kv_refusal = "Swin-v2 attends inside windows, so no key/value column is shared by every token"

    @classmethod
    def timm_class(cls) -> type:
        from timm.models.swin_transformer_v2 import SwinTransformerV2

        return SwinTransformerV2

    def check(self) -> None:
        from timm.layers import Mlp
        from timm.models.swin_transformer_v2 import (PatchMerging, SwinTransformerV2, SwinTransformerV2Block,
                                                     WindowAttention)

        self.refuse_overrides(SwinTransformerV2, _ENTRY_POINTS)
        if getattr(self.module, "absolute_pos_embed", None) is not None:
            raise self.unsupported("an absolute position embedding")
        for s, stage in enumerate(self.stages()):
            if not isinstance(stage.downsample, (nn.Identity, PatchMerging)):
                raise self.unsupported(f"layers.{s} has an unsupported downsampling {type(stage.downsample).__name__}")
        check_blocks(self, (SwinTransformerV2Block,), (WindowAttention,),
                     lambda block: None if type(block.mlp) is Mlp and not isinstance(block.mlp.fc1, nn.Conv2d)
                     else f"MLP type {type(block.mlp).__name__}")

    # ------------------------------------------------------------------ anatomy
    def stage_grids(self, img_size: Optional[Tuple[int, int]] = None) -> Tuple[Grid, ...]:
        """The token grid ``(h, w)`` of every stage for an input of ``img_size`` (default: the model's own)."""
        pe = self.module.patch_embed
        if img_size is None:
            grid = tuple(int(g) for g in pe.grid_size)
        elif hasattr(pe, "dynamic_feat_size"):
            grid = tuple(int(g) for g in pe.dynamic_feat_size(tuple(img_size)))
        else:
            grid = (img_size[0] // pe.patch_size[0], img_size[1] // pe.patch_size[1])
        grids = []
        for stage in self.module.layers:
            if not isinstance(stage.downsample, nn.Identity):
                grid = tuple((g + 1) // 2 for g in grid)  # patch merging pads an odd side
            grids.append(grid)
        return tuple(grids)

    def layout(self, img_size: Optional[Tuple[int, int]] = None) -> TokenLayout:
        grids = self.stage_grids(img_size)
        return TokenLayout(n_prefix=0, n_registers=0, cls_index=None, grid=grids[-1], stage_grids=grids,
                           block_stages=self.block_stages())

    def window_tokens(self, layer: int, img_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """Where block ``layer``'s window slots sit on its stage's grid: Long[n_w, N], the row-major token index
        of window ``w``'s slot ``n`` (-1 for padding). Index ``attn.hook_pattern[b, w, head, i, j]``'s query ``i``
        and key ``j`` with it to map a pattern back to the grid (token ``p`` covers the input pixels of cell
        ``(p // w_s, p % w_s)``, ``2**s`` patches of ``patch_size`` a side in stage ``s``)."""
        from timm.models.swin_transformer_v2 import window_partition

        block = self.block(layer)
        h, w = self.stage_grids(img_size)[self.block_stages()[layer]]
        ws, shift = block.window_size, block.shift_size
        idx = torch.arange(h * w).view(1, h, w, 1)
        if any(shift):
            idx = torch.roll(idx, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        pad_h, pad_w = (ws[0] - h % ws[0]) % ws[0], (ws[1] - w % ws[1]) % ws[1]
        idx = F.pad(idx, (0, 0, 0, pad_w, 0, pad_h), value=-1)
        return window_partition(idx, ws).reshape(-1, ws[0] * ws[1])

    def attends_to_tokens(self, layer: int) -> bool:
        """False: every block attends inside windows."""
        return False

    def downsampling(self, stage: int) -> Optional[Tuple[nn.Module, nn.Module]]:
        """(the patch merging's ``reduction`` [d_s, 4 d_{s-1}] over the 2x2 neighbours concatenated in timm's
        order of (row, column) offsets (0, 0), (1, 0), (0, 1), (1, 1), its LayerNorm); none where the stage does not merge (stage 0)."""
        down = self.module.layers[stage].downsample
        return None if isinstance(down, nn.Identity) else (down.reduction, down.norm)

    def received_attention(self, layer: int, pattern: torch.Tensor,
                           img_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """Per token of the stage's grid: the attention it receives as a key, averaged over heads and over the
        queries of its window (padding slots left out), from ``attn.hook_pattern`` [b, n_w, h, N, N]:
        Tensor[b, t] (row-major, :meth:`window_tokens`)."""
        idx = self.window_tokens(layer, img_size).to(pattern.device)  # [n_w, N]
        valid = idx >= 0
        p = pattern.float().mean(2)  # [b, n_w, N queries, N keys]
        got = (p * valid[None, :, :, None]).sum(2) / valid.sum(1).clamp_min(1)[None, :, None]  # [b, n_w, N]
        out = p.new_zeros(p.shape[0], int(valid.sum()))
        out[:, idx[valid]] = got[:, valid]
        return out

    def write_norms(self, layer: int):
        """The residual post-norm ``norm2`` follows ``fc2`` (and an inner MLP norm where the MLP has one)."""
        return super().write_norms(layer)[0], self.block(layer).norm2

    def check_input(self, x: torch.Tensor, model_name: str) -> None:
        """``(H, W)`` must be the model's own size, or a multiple of the patch size for a model built with
        ``dynamic_img_size=True`` (``strict_img_size=False``)."""
        super().check_input(x, model_name)
        pe = self.module.patch_embed
        hw = tuple(x.shape[-2:])
        if not getattr(pe, "strict_img_size", True):
            ph, pw = pe.patch_size
            if not getattr(pe, "dynamic_img_pad", False) and (hw[0] % ph or hw[1] % pw):
                raise ImageError(f"image size {hw} is not a multiple of the patch size {(ph, pw)}")
            return
        if hw != self.img_size:
            size = self.img_size
            raise ImageError(f"model {model_name} takes {size[0]}x{size[1]} images, got {hw[0]}x{hw[1]}. Resize "
                             "with interp.load_images(paths, model), or load the model with dynamic_img_size=True")

    # ------------------------------------------------------------------ hooked forward
    def residual_stream(self, hooked, x: torch.Tensor, n_blocks: Optional[int] = None) -> torch.Tensor:
        """timm's ``forward_features`` without the final norm: stage by stage (patch merging first in the later
        stages), each block on its stage's grid."""
        m = self.module
        n_blocks = len(self.blocks()) if n_blocks is None else n_blocks
        tokens, (h, w) = grid_tokens(m.patch_embed(x))
        tokens = hooked.hook_embed(hooked.hook_patch_embed(tokens))
        if n_blocks == 0:
            return tokens
        layer = 0
        for stage in m.layers:
            if not isinstance(stage.downsample, nn.Identity):
                tokens, (h, w) = grid_tokens(stage.downsample(tokens.reshape(tokens.shape[0], h, w, -1)))
            for block in stage.blocks:
                tokens = block_forward(block, tokens, (h, w))
                layer += 1
                if layer == n_blocks:
                    return tokens
        return tokens

    def forward_features(self, hooked, x: torch.Tensor) -> torch.Tensor:
        """Images -> the final normed tokens [b, t, d] (timm returns them as a [b, h, w, d] map)."""
        return hooked.hook_norm_final(self.module.norm(self.residual_stream(hooked, x)))

    def forward_head(self, hooked, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """timm's ``ClassifierHead``: its pooling over the grid (or a pooling override), dropout (-> ``hook_pooled``),
        ``fc`` (-> ``hook_logits``)."""
        head, state = self.module.head, hooked.edit_state
        if state.pool_override is not None:
            pooled, votes = state.pool_override(tokens)
            if votes is not None:
                hooked.hook_selective_votes(votes)
        else:
            h, w = self.layout(hooked._input_hw).grid
            pooled = head.global_pool(tokens.reshape(tokens.shape[0], h, w, tokens.shape[-1]))
        pooled = hooked.hook_pooled(head.drop(pooled))
        return head.flatten(pooled) if pre_logits else hooked.hook_logits(head.flatten(head.fc(pooled)))

    # ------------------------------------------------------------------ plain timm models
    def plain_mlp_edits(self, layer: int, edits) -> None:
        mlp = self.mlp(layer)
        mlp.drop1 = MlpActivationEdits(edits, mlp.drop1)

    def describe(self) -> dict:
        blocks = [b for _, b in self.blocks()]
        return {"family": self.name, "stages": len(self.module.layers),
                "window_sizes": [list(b.window_size) for b in blocks], "shifts": [list(b.shift_size) for b in blocks]}


def _to_windows(t: torch.Tensor, b: int) -> torch.Tensor:
    """[b * n_w, h, N, dh] -> [b, n_w, N, h, dh] (what the q/k/v/z hooks see)."""
    bw, heads, n, dh = t.shape
    return t.reshape(b, bw // b, heads, n, dh).transpose(2, 3)


def _from_windows(t: torch.Tensor) -> torch.Tensor:
    """[b, n_w, N, h, dh] -> [b * n_w, h, N, dh]."""
    b, nw, n, heads, dh = t.shape
    return t.transpose(2, 3).reshape(b * nw, heads, n, dh)


def _hook_windows(hook, t: torch.Tensor, b: int) -> torch.Tensor:
    return _from_windows(hook(_to_windows(t, b)))


def window_attention(attn: nn.Module, x: torch.Tensor, mask: Optional[torch.Tensor], b: int) -> torch.Tensor:
    """Hooked forward of ``timm.models.swin_transformer_v2.WindowAttention``, op for op.

    Args:
        x: [b * n_w, N, d] the tokens of every window (windows of one image consecutive).
        mask: the shift mask [n_w, N, N] (0 or -100), or None.
        b: the batch size (the hooks see windows per image).

    Returns:
        [b * n_w, N, d] the attention output (after ``proj``).
    """
    B_, N, C = x.shape
    if attn.q_bias is None:
        qkv = attn.qkv(x)
    else:
        qkv_bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
        if attn.qkv_bias_separate:
            qkv = attn.qkv(x)
            qkv += qkv_bias
        else:
            qkv = F.linear(x, weight=attn.qkv.weight, bias=qkv_bias)
    qkv = qkv.reshape(B_, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each [b * n_w, h, N, dh]
    q, k, v = (_hook_windows(hook, t, b) for hook, t in ((attn.hook_q, q), (attn.hook_k, k), (attn.hook_v, v)))

    scores = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
    scores = scores * torch.clamp(attn.logit_scale, max=math.log(1. / 0.01)).exp()
    table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
    area = attn.window_size[0] * attn.window_size[1]
    bias = table[attn.relative_position_index.view(-1)].view(area, area, -1).permute(2, 0, 1).contiguous()
    scores = scores + 16 * torch.sigmoid(bias).unsqueeze(0)
    if mask is not None:
        num_win = mask.shape[0]
        scores = scores.view(-1, num_win, attn.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
        scores = scores.view(-1, attn.num_heads, N, N)
    shape = (b, B_ // b, attn.num_heads, N, N)
    scores = attn.hook_attn_scores(scores.view(shape)).view(B_, attn.num_heads, N, N)
    pattern = attn.hook_pattern(attn.softmax(scores).view(shape)).view(B_, attn.num_heads, N, N)
    z = _hook_windows(attn.hook_z, attn.attn_drop(pattern) @ v, b)  # [b * n_w, h, N, dh]
    return attn.proj_drop(attn.proj(z.transpose(1, 2).reshape(B_, N, C)))


def shifted_window_attention(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``SwinTransformerV2Block._attn`` with the hooked attention: x [b, h, w, d] -> [b, h, w, d]."""
    from timm.models.swin_transformer_v2 import window_partition, window_reverse

    B, H, W, C = x.shape
    has_shift = any(block.shift_size)
    shifted = torch.roll(x, shifts=(-block.shift_size[0], -block.shift_size[1]), dims=(1, 2)) if has_shift else x
    ws = block.window_size
    pad_h, pad_w = (ws[0] - H % ws[0]) % ws[0], (ws[1] - W % ws[1]) % ws[1]
    shifted = F.pad(shifted, (0, 0, 0, pad_w, 0, pad_h))
    _, Hp, Wp, _ = shifted.shape
    windows = window_partition(shifted, ws).view(-1, block.window_area, C)
    mask = block.get_attn_mask(shifted) if getattr(block, "dynamic_mask", False) else block.attn_mask
    out = window_attention(block.attn, windows, mask, B).view(-1, ws[0], ws[1], C)
    shifted = window_reverse(out, ws, (Hp, Wp))[:, :H, :W, :].contiguous()
    return torch.roll(shifted, shifts=block.shift_size, dims=(1, 2)) if has_shift else shifted


def block_forward(block: nn.Module, x: torch.Tensor, grid: Grid) -> torch.Tensor:
    """Hooked forward of ``SwinTransformerV2Block`` (residual post-norm). x: [b, t, d] on ``grid`` -> [b, t, d]."""
    B, L, C = x.shape
    resid_pre = block.hook_resid_pre(x)
    attn = shifted_window_attention(block, resid_pre.reshape(B, grid[0], grid[1], C))
    attn_out = block.hook_attn_out(block.norm1(attn).reshape(B, L, C))
    resid_mid = block.hook_resid_mid(resid_pre + block.drop_path1(attn_out))
    mlp_out = block.hook_mlp_out(block.norm2(mlp_forward(block.mlp, resid_mid)))
    return block.hook_resid_post(resid_mid + block.drop_path2(mlp_out))
