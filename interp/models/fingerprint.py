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
    """Hash of keys, shapes and cheap value digests of every tensor (sums over the whole tensor and over
    two strided subsets, min and max), computed where the tensor lives.

    Cheap enough for ViT-g; any real change of the weights (another checkpoint, a fine-tune, an edit of
    more than a rounding error) changes it, and it does not depend on the thread count or device.
    """
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().reshape(-1)
        if t.numel() == 0:
            digest = "empty"
        else:
            if not t.is_floating_point():
                t = t.double()
            low, high = torch.aminmax(t)
            # float64 sums: their rounding does not depend on the reduction order (threads, device) at
            # the 10 digits kept, unlike float32 sums.
            parts = (t.sum(dtype=torch.float64), t[::7].sum(dtype=torch.float64),
                     t[1::3].sum(dtype=torch.float64), low, high)
            digest = ":".join(f"{float(v):.10e}" for v in parts)
        h.update(f"{name}:{tuple(tensor.shape)}:{digest};".encode())
    return h.hexdigest()[:16]
