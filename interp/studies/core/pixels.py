"""Edits of preprocessed images in pixel space that more than one study theme makes (masking's blur fill, the
causal toolkit's blurred region).

>>> blurred = gaussian_blur(images, 8.0)       # images [b, 3, H, W] -> the same shape
>>> blurred.shape == images.shape
True
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of images [b, C, H, W] (radius ceil(3 sigma), replicate padding)."""
    radius = max(1, int(math.ceil(3 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=torch.float32, device=x.device)
    kernel = torch.exp(-t ** 2 / (2 * sigma ** 2))
    kernel = (kernel / kernel.sum()).to(x.dtype)
    c = x.shape[1]
    out = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="replicate"), kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1),
                   groups=c)
    return F.conv2d(F.pad(out, (0, 0, radius, radius), mode="replicate"), kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1),
                    groups=c)
