"""Oracle: Fix-Reg-Mean of Sun et al. 2024 on a timm DINOv2-reg ViT.

Transcribes ``locuslab/massive-activations`` ``lib/eval_utils.py`` (``fix_reg_mean``, its
``custom_layer_forward``; commit 7e5e64cb1c2ca492fb3a1800c8cf5d163fd902dd): every block's forward first overwrites
the 4 register rows (``x[:, reg_id + 1, :]``, CLS at row 0) with that layer's precomputed mean, then runs
``x + drop_path1(ls1(attn(norm1(x))))`` and ``x + drop_path2(ls2(mlp(norm2(x))))``. Only a test oracle, never
imported by ``interp``.
"""
from __future__ import annotations

import types

import torch


def apply_fix_reg_mean(model: torch.nn.Module, reg_feat_mean) -> None:
    """Patch ``model.blocks`` in place; ``reg_feat_mean[layer_id]`` is [4, d] (the registers' mean at that block's
    input)."""
    def custom_layer_forward(self, x: torch.Tensor) -> torch.Tensor:
        for reg_id in range(4):
            reg_id = int(reg_id)
            cur_reg_feat = self.reg_feat[reg_id].clone()
            x[:, reg_id + 1, :] = cur_reg_feat.reshape(1, -1).repeat(x.shape[0], 1)
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

    for layer_id in range(len(model.blocks)):
        layer = model.blocks[layer_id]
        layer.reg_feat = reg_feat_mean[layer_id]
        layer.forward = types.MethodType(custom_layer_forward, layer)
