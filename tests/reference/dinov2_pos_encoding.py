"""Test oracle: DINOv2's token embedding at any input size, transcribed from the DINOv2 repository.

Follows repo ``facebookresearch/dinov2``:

* ``dinov2/models/vision_transformer.py`` (commit ``112792f1667374eb2253cc82bca19d101655356f``),
  ``DinoVisionTransformer.interpolate_pos_encoding`` and ``prepare_tokens_with_masks``: at every forward the
  position table ``pos_embed`` [1, 1 + M*M, d] is used as it is when the input has M*M patches and is square;
  otherwise its patch rows are resampled in float32, ``F.interpolate(mode="bicubic")`` with
  ``antialias=interpolate_antialias`` and, when ``interpolate_offset`` is non-zero, ``scale_factor=((w0 + offset)
  / M, (h0 + offset) / M)``, else ``size=(w0, h0)`` (w0, h0 = the input's height and width over the patch size);
  the CLS row is kept. Tokens: patch embedding, CLS prepended, the table added, then the register tokens
  inserted after CLS (they get no position);
* ``dinov2/hub/backbones.py`` (commit ``a44758b484a74be120c3b74876569e085088cd02``): the released models
  without registers use ``interpolate_offset=0.1, interpolate_antialias=False``; the ``_reg`` models
  ``interpolate_offset=0.0, interpolate_antialias=True``.

The blocks are DINOv2's pre-norm blocks with LayerScale, here run from a timm module holding the same weights
(timm's ``Block`` computes ``x + ls1(attn(norm1(x)))``, ``x + ls2(mlp(norm2(x)))`` as DINOv2's does). Used ONLY as
a test oracle, never by the library.
"""
from __future__ import annotations

import math
from typing import List

import torch
import torch.nn.functional as F

PLAIN = {"interpolate_offset": 0.1, "interpolate_antialias": False}
REGISTERS = {"interpolate_offset": 0.0, "interpolate_antialias": True}


def interpolate_pos_encoding(pos_embed: torch.Tensor, npatch: int, w: int, h: int, patch_size: int,
                             interpolate_offset: float, interpolate_antialias: bool) -> torch.Tensor:
    """DINOv2's position table [1, 1 + w0*h0, d] for an input of height ``w`` and width ``h`` (DINOv2's names)."""
    N = pos_embed.shape[1] - 1
    if npatch == N and w == h:
        return pos_embed
    previous_dtype = pos_embed.dtype
    pos = pos_embed.float()
    class_pos, patch_pos = pos[:, 0], pos[:, 1:]
    dim = pos.shape[-1]
    w0, h0 = w // patch_size, h // patch_size
    M = int(math.sqrt(N))
    assert N == M * M
    if interpolate_offset:
        kwargs = {"scale_factor": (float(w0 + interpolate_offset) / M, float(h0 + interpolate_offset) / M)}
    else:
        kwargs = {"size": (w0, h0)}
    patch_pos = F.interpolate(patch_pos.reshape(1, M, M, dim).permute(0, 3, 1, 2), mode="bicubic",
                              antialias=interpolate_antialias, **kwargs)
    assert (w0, h0) == tuple(patch_pos.shape[-2:])
    patch_pos = patch_pos.permute(0, 2, 3, 1).reshape(1, -1, dim)
    return torch.cat((class_pos.unsqueeze(0), patch_pos), dim=1).to(previous_dtype)


@torch.no_grad()
def prepare_tokens(state_dict: dict, x: torch.Tensor, patch_size: int, interpolate_offset: float,
                   interpolate_antialias: bool) -> torch.Tensor:
    """DINOv2's tokens [b, 1 + R + P, d] entering block 0, from an original DINOv2 state dict."""
    _, _, w, h = x.shape
    tokens = F.conv2d(x, state_dict["patch_embed.proj.weight"], state_dict["patch_embed.proj.bias"],
                      stride=patch_size).flatten(2).transpose(1, 2)
    tokens = torch.cat((state_dict["cls_token"].expand(x.shape[0], -1, -1), tokens), dim=1)
    tokens = tokens + interpolate_pos_encoding(state_dict["pos_embed"], tokens.shape[1] - 1, w, h, patch_size,
                                               interpolate_offset, interpolate_antialias)
    registers = state_dict.get("register_tokens")
    if registers is not None:
        tokens = torch.cat((tokens[:, :1], registers.expand(x.shape[0], -1, -1), tokens[:, 1:]), dim=1)
    return tokens


@torch.no_grad()
def block_outputs(state_dict: dict, blocks, x: torch.Tensor, patch_size: int, interpolate_offset: float,
                  interpolate_antialias: bool) -> List[torch.Tensor]:
    """The residual stream [b, t, d] after each block of DINOv2's forward at ``x``'s size."""
    h = prepare_tokens(state_dict, x, patch_size, interpolate_offset, interpolate_antialias)
    outputs = []
    for blk in blocks:
        h = blk(h)
        outputs.append(h)
    return outputs
