"""What a planted model planted (:class:`PlantedTruth`, :func:`planted_truth`): the ground truth the studies are
checked against, kept on the timm module by :func:`~interp.models.planted.plant.plant`."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from ..families import family_of

TRUTH_ATTR = "_interp_planted_truth"  # where plant() keeps the truth on the timm module


def softabs_energy(resp: torch.Tensor, gain: float) -> torch.Tensor:
    """Texture energy ``sum_f softabs(r_f)`` [b, 1, h, w] of filter responses ``resp`` [b, F, h, w]:
    ``softabs(r) = (GELU(g r) + GELU(-g r)) / g`` (about |r| for large responses, 0 for flat patches)."""
    return ((nn.functional.gelu(gain * resp) + nn.functional.gelu(-gain * resp)) / gain).sum(1, keepdim=True)


@dataclass(frozen=True)
class PlantedTruth:
    """What :func:`planted_vit` (or :func:`planted_dinov3`) planted, in the terms the studies report."""

    layer: int
    neurons: Tuple[int, ...]
    tau: float
    n_filters: int
    texture_dim: int
    artifact_dim: int
    anchor_dims: Tuple[int, int]
    patch_size: int
    gelu_gain: float = 4.0
    description: str = "synthetic ViT with planted register neurons (random weights; not a trained model)"
    washed_at: Optional[int] = None  # the block whose MLP writes the artifacts out again (planted_vit(wash=...))

    def to_dict(self) -> dict:
        return asdict(self)

    def texture_energy(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Per-patch texture energy E [b, h, w] the planted circuit computes from the pixels.

        ``E = sum_f softabs(r_f)``, r_f the patch's response to filter f, ``softabs(r) = (GELU(g r) +
        GELU(-g r)) / g`` with g = ``gelu_gain`` (about |r| for large responses, 0 for flat patches).
        """
        pe = family_of(getattr(model, "timm_model", model)).patch_proj()
        with torch.no_grad():
            resp = nn.functional.conv2d(images.to(pe.weight.dtype), pe.weight[: self.n_filters],
                                        stride=pe.stride)  # [b, F, h, w]
            return softabs_energy(resp, self.gelu_gain)[:, 0]

    def artifact_mask(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Bool [b, h, w]: patches that become high-norm tokens.

        These are the patches with texture energy below ``tau / 2``, where the register neurons fire at
        more than half their full activation (the token norm is then past the middle of the gap between
        ordinary and high-norm tokens).
        """
        return self.texture_energy(model, images) < self.tau / 2


@dataclass(frozen=True)
class PlantedPyramidTruth(PlantedTruth):
    """What a planted pyramid (``planted_pvt``, ``planted_swin``) planted: ``layer`` is the flat block index of
    block ``block`` of stage ``stage``, and the high-norm tokens live on that stage's grid."""

    stage: int = 3
    block: int = 0

    def texture_energy(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Per-token texture energy E [b, h_s, w_s] on the planted stage's grid: ``E0 = sum_f softabs(r_f)`` per
        cell of the patch embedding's grid (r_f: the response to filter f of the embedding convolution, its zero
        padding included), then every downsampling to the planted stage averages 2x2 cells (an odd grid padded
        with zeros first, as timm pads): what the construction computes."""
        pe = family_of(getattr(model, "timm_model", model)).patch_proj()
        with torch.no_grad():
            resp = nn.functional.conv2d(images.to(pe.weight.dtype), pe.weight[: self.n_filters], stride=pe.stride,
                                        padding=pe.padding)  # [b, F, h0, w0]
            energy = softabs_energy(resp, self.gelu_gain)
            for _ in range(self.stage):
                h, w = energy.shape[-2:]
                energy = nn.functional.avg_pool2d(nn.functional.pad(energy, (0, w % 2, 0, h % 2)), 2)
        return energy[:, 0]


@dataclass(frozen=True)
class PlantedPvtTruth(PlantedPyramidTruth):
    """What :func:`planted_pvt` planted (``layer``: the flat index of ``stages.{stage}.blocks.{block}``)."""

    description: str = "synthetic PVTv2-b0 with planted register neurons (random weights; not a trained model)"


@dataclass(frozen=True)
class PlantedSwinTruth(PlantedPyramidTruth):
    """What :func:`planted_swin` planted (``layer``: the flat index of ``layers.{stage}.blocks.{block}``)."""

    description: str = "synthetic Swin-v2 with planted register neurons (random weights; not a trained model)"


def planted_truth(model: nn.Module) -> Optional[PlantedTruth]:
    """What a planted model planted in ``model`` (a ``HookedViT`` or the timm module), or None for any other
    model.

    >>> truth = planted_truth(interp.load("planted_vit"))
    >>> {truth.layer: list(truth.neurons)}
    {2: [17, 101, 402, 655]}
    """
    module = getattr(model, "timm_model", model)
    truth = getattr(module, TRUTH_ATTR, None)
    return truth if isinstance(truth, PlantedTruth) else None
