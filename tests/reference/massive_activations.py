"""Oracle: the layer-wise massive-activation profile of Sun et al. 2024 on a timm ViT.

Transcribes ``locuslab/massive-activations`` (commit 7e5e64cb1c2ca492fb3a1800c8cf5d163fd902dd):
``main_vit.py`` (``--exp2``: one image at a time; per layer the three largest entries of ``|feat|`` over the
flattened tensor and ``torch.median(feat_abs)``; ``np.mean(stats, axis=0)`` over the images) and
``monkey_patch/modify_vit.py`` (``vit_custom_block_forward``: ``feat`` is the block's output, detached, on the
CPU, in float64). Only a test oracle, never imported by ``interp``.
"""
from __future__ import annotations

import numpy as np
import torch


def layer_stats(model: torch.nn.Module, blocks, images: torch.Tensor) -> np.ndarray:
    """Float64[4, L]: rows top-1, top-2, top-3 and median |block output|, each the mean over ``images``
    ([N, 3, H, W], already preprocessed), fed one at a time as the reference does."""
    feats = {}
    handles = [block.register_forward_hook(
        lambda module, args, out, i=i: feats.__setitem__(i, out.clone().detach().cpu().double()))
        for i, block in enumerate(blocks)]
    stats = []
    try:
        for image in images:
            with torch.no_grad():
                model(image.unsqueeze(0))
            layer_stats_np = np.zeros((4, len(blocks)))
            for layer_id in range(len(blocks)):
                feat_abs = feats[layer_id].abs()
                sort_res = torch.sort(feat_abs.flatten(), descending=True)
                layer_stats_np[:3, layer_id] = sort_res.values[:3]
                layer_stats_np[3, layer_id] = torch.median(feat_abs)
            stats.append(layer_stats_np)
    finally:
        for handle in handles:
            handle.remove()
    return np.mean(stats, axis=0)
