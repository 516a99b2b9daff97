"""Short, stable fingerprints of a model's architecture and weights.

Caches and patch files store them, so that opening one with another model is a clear error.
"""
from __future__ import annotations

import hashlib

import torch
from torch import nn


def architecture_fingerprint(module: nn.Module) -> str:
    """Hash of the state-dict keys and shapes (not the values): same for any weights of one architecture."""
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        h.update(f"{name}:{tuple(tensor.shape)};".encode())
    return h.hexdigest()[:16]


@torch.no_grad()
def weights_fingerprint(module: nn.Module) -> str:
    """Hash of keys, shapes and a cheap digest of every tensor's values (float64 sums at fixed strides).

    Cheap enough to compute on ViT-g; any real change of the weights changes it.
    """
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().reshape(-1)
        if t.is_floating_point() or t.is_complex():
            t = t.double()
        else:
            t = t.to(torch.float64)
        n = t.numel()
        idx = torch.arange(n, device=t.device, dtype=torch.float64)
        digest = (
            float(t.sum()) if n else 0.0,
            float((t * (idx % 7 + 1)).sum()) if n else 0.0,
            float(t.abs().max()) if n else 0.0,
        )
        h.update(f"{name}:{tuple(tensor.shape)}:{digest[0]:.8e}:{digest[1]:.8e}:{digest[2]:.8e};".encode())
    return h.hexdigest()[:16]
