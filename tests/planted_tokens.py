"""Two planted register models for the token-replacement study: a tiny timm ViT (CLS, one register, 2 blocks, MLPs
off) whose answer is set by hand, so the study has a known reading.

Channels: 0 flags the register, 1 flags CLS, 2..9 a slot block 0 may fill, 10..17 what CLS reads in block 1,
18 the register's presence as CLS reads it; patches carry image content in 32..191 only (their patch embedding
writes nothing below 32, the position table is zero).

The model has no head: the study reads the pooled vector (CLS after the final norm).

* ``"fungible"``: block 0 does nothing, so the register is the same vector in every image. Block 1: CLS attends to
  the register (a sink: its query reads the CLS flag, the register's key the register flag) and copies its
  presence into channel 18. Only the register's presence matters: zeroing it makes CLS attend to the patches,
  while its mean, noise with its (zero) spread, or another image's register change nothing.
* ``"image-specific"``: block 0 lets the register gather the mean of the image's content into its slot (CLS
  attends to itself there); block 1: CLS attends to the register and copies its slot into 10..17, strongly. The
  register's content is the image's: another image's register changes the output.
"""
from __future__ import annotations

import torch

import interp

FLAG_REG, FLAG_CLS, SLOT, READ, PRESENCE, CONTENT = 0, 1, range(2, 10), range(10, 18), 18, 32


def planted_register_model(kind: str, seed: int = 0) -> "interp.HookedViT":
    """The planted model of ``kind`` (module doc): 64 px, 16 patches of 16 px, width 192, 3 heads."""
    assert kind in ("fungible", "image-specific")
    model = interp.load("vit_tiny_patch16_224", pretrained=False, seed=seed, depth=2, img_size=64, reg_tokens=1,
                        num_classes=0)
    vit, d = model.timm_model, 192
    with torch.no_grad():
        vit.pos_embed.zero_()
        vit.patch_embed.proj.weight[:CONTENT] = 0
        vit.patch_embed.proj.bias[:CONTENT] = 0
        vit.cls_token.zero_()[0, 0, FLAG_CLS] = 10.0
        # a small flag in the image-specific model, so that the gathered content dominates the register's state
        vit.reg_token.zero_()[0, 0, FLAG_REG] = 10.0 if kind == "fungible" else 1.0
        for block in vit.blocks:
            for p in (block.attn.qkv.weight, block.attn.qkv.bias, block.attn.proj.weight, block.attn.proj.bias,
                      block.mlp.fc2.weight, block.mlp.fc2.bias):
                p.zero_()
        q, k, v = 0, d, 2 * d  # rows of the fused qkv weight; head 0 = the first 64 of each
        gather, read = vit.blocks[0].attn, vit.blocks[1].attn
        if kind == "image-specific":
            gather.qkv.weight[q, FLAG_CLS] = gather.qkv.weight[k, FLAG_CLS] = 2.0  # CLS attends to itself
            for j, slot in enumerate(SLOT):
                gather.qkv.weight[v + j, CONTENT + j] = 1.0
                gather.proj.weight[slot, j] = 1.0
        read.qkv.weight[q, FLAG_CLS] = read.qkv.weight[k, FLAG_REG] = 2.0  # CLS -> register, a sink
        if kind == "image-specific":
            for j, (slot, out) in enumerate(zip(SLOT, READ)):
                read.qkv.weight[v + j, slot] = 1.0
                read.proj.weight[out, j] = 20.0
        else:
            read.qkv.weight[v, FLAG_REG] = 1.0
            read.proj.weight[PRESENCE, 0] = 1.0
    return model
