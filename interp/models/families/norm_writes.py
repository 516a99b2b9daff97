"""A neuron's write through a LayerNorm, linearised at the data's operating point (issue 47 item 6).

Where a norm sits between an MLP neuron and the residual stream (EVA02's inner MLP norm ``mlp.norm``,
``scale_mlp``: between the neurons and ``fc2``; Swin-v2's and EVA post-norm blocks' ``norm2``: between ``fc2`` and
the residual), what the neuron adds to the residual is not linear in its activation: a unit of activation writes
``J(z) fc2[:, n]`` (or ``fc2 J(h)[:, n]``), with ``J`` the norm's Jacobian at its input ``z`` of that token. The
write direction interp reports there is the **linearised write at the operating point**: the Jacobian averaged
over the tokens it is given (``mean_t J(z_t)``), applied to ``fc2``'s column and LayerScale; averaging is linear, so
it equals the mean over those tokens of the change of the residual per unit nudge of the neuron (to first order).

LayerNorm ``y = g * (z - mean(z)) / s + b``, ``s = sqrt(var(z) + eps)``, over the last axis of width D has
``J(z) = diag(g) (I - 1 1^T / D - x x^T / D) / s`` with ``x = (z - mean(z)) / s``; so
``mean_t J = diag(g) (mean(1/s) (I - 1 1^T / D) - mean(x x^T / s) / D)``.

>>> norm = torch.nn.LayerNorm(4)
>>> z = torch.randn(8, 4)
>>> j = mean_jacobian(norm, z)
>>> exact = torch.stack([torch.autograd.functional.jacobian(norm, zi) for zi in z]).mean(0)
>>> bool(torch.allclose(j.float(), exact, atol=1e-5))
True
"""
from __future__ import annotations

import torch
from torch import nn

from ...errors import InterpError

CHUNK = 4096  # tokens per step of the average (memory: CHUNK x D)


def mean_jacobian(norm: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """``mean_t dnorm(z_t)/dz_t``: Tensor[D, D] (float64) over the rows of ``z`` [m, D] (m >= 1).

    Raises:
        InterpError: a norm other than ``nn.LayerNorm`` over the last axis (its Jacobian is not implemented here:
            no write direction is reported through it).
    """
    if not isinstance(norm, nn.LayerNorm) or len(norm.normalized_shape) != 1:
        raise InterpError(f"a {type(norm).__name__} sits between the neurons and the residual stream: interp "
                          "linearises writes through a LayerNorm only, so it reports no write direction here")
    z = z.detach().reshape(-1, z.shape[-1]).double()
    if not len(z):
        raise InterpError("the write direction through a LayerNorm needs activations (the operating point)")
    d = z.shape[-1]
    inv_sum, outer = torch.zeros((), dtype=torch.float64), torch.zeros(d, d, dtype=torch.float64)
    for chunk in z.split(CHUNK):
        centred = chunk - chunk.mean(-1, keepdim=True)
        inv = (centred.square().mean(-1) + norm.eps).rsqrt()  # 1/s [c]
        x = centred * inv[:, None] * inv.sqrt()[:, None]  # x_t / sqrt(s_t): x x^T / s summed as x'^T x'
        inv_sum += inv.sum()
        outer += x.T @ x
    m = len(z)
    eye = torch.eye(d, dtype=torch.float64)
    j = (inv_sum / m) * (eye - 1.0 / d) - outer / (m * d)
    gain = norm.weight.detach().double() if norm.weight is not None else torch.ones(d, dtype=torch.float64)
    return gain[:, None] * j
