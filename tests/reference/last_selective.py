"""Test oracle: the LaSt selective CLS aggregation, transcribed from its public reference code.

Follows repo ``ChengShiest/LAST-ViT``, file ``cls_pretrain/conf.py``, class ``dense_vit``
(``gaussian_kernel_1d`` and ``forward`` after ``self.encoder``). The index holds two versions of that file:
commit ``434f6ce9948f47f4f942ba4cf802de314b7cf70c`` ends with ``cls_token = torch.mean(x, dim=1)`` (the mean
of the low-passed tokens over all patches: the early bug), the later version (same repo and path; its commit is
not recorded in the index, the repo README quotes the same code) ends with
``cls_token = torch.mean(sel_p, dim=1)``, the mean of the ORIGINAL values of the selected patches. This file
follows the later version. The reference hard-codes d = 768 and k = 1; here d and k are arguments, everything
else is the reference's arithmetic, op for op, in float32. Used ONLY as a test oracle, never by the library.
"""
from __future__ import annotations

from typing import Tuple

import torch


def gaussian_kernel_1d(kernel_size: int, sigma: float) -> torch.Tensor:
    """``dense_vit.gaussian_kernel_1d``: note Python's ``-kernel_size // 2`` is floor(-kernel_size / 2)."""
    kernel = torch.exp(-0.5 * (torch.arange(-kernel_size // 2 + 1, kernel_size // 2 + 1).float() / sigma) ** 2)
    return kernel / torch.max(kernel)


def reference_low_pass(patches: torch.Tensor) -> torch.Tensor:
    """Patch tokens [b, n, d] -> the reference's low-passed tokens [b, n, d] (sigma = d ** 0.5)."""
    d = patches.shape[-1]
    gs_k = gaussian_kernel_1d(d, d ** 0.5).to(patches.device).unsqueeze(0).unsqueeze(0)
    x = torch.fft.fft(patches, dim=-1)
    x = torch.fft.fftshift(x, dim=-1)
    x = x * gs_k
    x = torch.fft.ifftshift(x, dim=-1)
    return torch.fft.ifft(x, dim=-1).real


def reference_selective_cls(patches: torch.Tensor, k: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Patch tokens [b, n, d] (CLS excluded) -> (cls_token [b, d], selected patch indices [b, k, d])."""
    x_detach = patches
    x = reference_low_pass(patches)
    diff = x_detach / torch.abs(x - x_detach)
    _, indices = torch.topk(diff, k=k, dim=1, largest=True)
    sel_p = torch.gather(x_detach, 1, indices)
    cls_token = torch.mean(sel_p, dim=1)
    return cls_token, indices
