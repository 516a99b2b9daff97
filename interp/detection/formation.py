"""Formed inside, or carried from the input: did the blocks raise a high-norm token's norm?

Darcet's and Jiang's artifacts form inside the network: their norm jumps at some block. A token whose norm is
already high where the image enters the blocks (a saturated or high-contrast patch, whose patch embedding is
large) and that the blocks merely carry is not an artifact in the papers' sense, even when it is the upper mode
of the detection block's norms (a random-init DINOv3-S over images with a few high-contrast patches: 4.8x its
image's median already at ``blocks.0.hook_resid_pre``, unchanged through every block).

The rule: each patch token's norm over its image's scale (the 10th-percentile patch norm of that image, the
split's own scale, :data:`~interp.detection.norm_split.SCALE_PERCENTILE`: robust where artifacts are most of a
photo) at the detection block, against the same ratio at the input of block 0. A detected token is "high-norm
from the input" when it was already high there (its input ratio at least :data:`MIN_FORMED_GAIN`) and the
blocks did not raise it by that factor again (its ratio at the detection block below :data:`MIN_FORMED_GAIN`
times its input ratio); every other token above the threshold was formed by the blocks (an ordinary token a
low fixed threshold takes in is the threshold's matter, :mod:`interp.detection.thresholds`). On a pyramid the input (stage 0's grid) is pooled onto the detection stage's grid by the maximum over
the input cells each token covers (a token is carried from the input when any of its cells was already high).

>>> import torch
>>> inputs = torch.ones(1, 4); inputs[0, 3] = 5.0                  # token 3 is high-norm at the input
>>> ratios = input_ratios(inputs, (2, 2), (2, 2))
>>> formed_mask(torch.tensor([[1.0, 1.0, 6.0, 5.0]]), ratios).tolist()   # token 2 formed, token 3 carried
[[True, True, True, False]]
"""
from __future__ import annotations

from typing import Tuple

import torch

from .norm_split import SCALE_PERCENTILE

# A detected token formed in the network when its norm ratio (over its image's 10th-percentile norm) at the
# detection block is at least this many times its ratio at the input of block 0: the two-mode test's own bar
# for a separate mode (MIN_MODE_RATIO). Real artifacts are raised far more (3-10x over the bulk from inputs
# near it); a token the blocks only carry keeps a gain near 1.
MIN_FORMED_GAIN = 2.0


def image_ratios(norms: torch.Tensor) -> torch.Tensor:
    """Each patch norm over its image's 10th-percentile patch norm: [N, P] float64 from norms [N, P]."""
    x = norms.double()
    scale = torch.quantile(x, SCALE_PERCENTILE / 100, dim=1, keepdim=True) if x.shape[1] else x[:, :1]
    return x / scale.clamp_min(1e-30)


def input_ratios(input_norms: torch.Tensor, input_grid: Tuple[int, int], grid: Tuple[int, int]) -> torch.Tensor:
    """The input's norm ratios (:func:`image_ratios`) on the detection grid ``grid``: [N, P] float64, from the
    input's patch norms [N, h0 * w0] on ``input_grid``; pooled by the maximum over the input cells each token of
    ``grid`` covers (a pyramid's later stages), the ratios themselves when the grids are equal."""
    ratios = image_ratios(input_norms)
    if tuple(input_grid) == tuple(grid):
        return ratios
    cells = ratios.reshape(-1, 1, *input_grid)
    return torch.nn.functional.adaptive_max_pool2d(cells, tuple(grid)).flatten(1)


def formed_mask(norms: torch.Tensor, input_ratio: torch.Tensor, min_gain: float = MIN_FORMED_GAIN) -> torch.Tensor:
    """Bool [N, P]: False for the tokens carried from the input (their ratio at the input, ``input_ratio``
    [N, P] from :func:`input_ratios`, at least ``min_gain``, and their ratio at the detection block, from
    ``norms`` [N, P], below ``min_gain`` times it), True for the others."""
    carried = (input_ratio >= min_gain) & (image_ratios(norms) < min_gain * input_ratio)
    return ~carried
