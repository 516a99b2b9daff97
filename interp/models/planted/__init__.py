"""Small models with register neurons planted by construction: the ground truth for tests and the demo.

One circuit (:mod:`.circuit`), planted into a random-init timm model of a family through its adapter
(:mod:`.plant`); the models users load by name (``planted_vit``, ``planted_dinov3``, ``planted_pvt``,
``planted_swin``) are in :mod:`.models`. In the planted ViT (all other weights are timm's random init with a
fixed seed; ``d`` = embed dim; what the other families change: :mod:`.plant`):

* Reserved residual dimensions: ``0..F-1`` hold F zero-mean high-pass filter responses of the patch
  (patch embedding rows), ``F`` is the *texture* channel, ``F+1`` the *artifact* channel, ``F+2`` and
  ``F+3`` two anchor channels fixed at ``+A`` and ``-A`` in every token (through ``pos_embed``). The anchors
  make every LayerNorm scale nearly token-independent, and every planted weight row that reads a reserved
  dim also reads the anchors with half its weight and opposite sign, which cancels LayerNorm's mean
  subtraction exactly; so the planted circuit is close to linear.
  Every attention ``proj`` and MLP ``fc2`` has zero rows on the reserved dims, except the planted writes.
* Block 0 MLP computes texture energy ``E = sum_f softabs(filter_f . patch)`` (pairs of GELU neurons
  reading ``+-`` each filter channel; ``softabs`` is about ``|.|``) into the texture channel. A flat patch has ``E = 0``. CLS starts with a large
  texture value so it never triggers.
* Block ``layer`` MLP: the ``neurons`` (register neurons) fire as ``GELU(b * (1 - E / tau))``: about ``b`` on
  flat patches, about 0 on textured ones, and write ``w_out`` each into the artifact channel. From the
  output of that MLP on, flat-patch tokens have a norm several times the others: high-norm tokens that
  emerge in the MLP of ``layer`` (attention there changes nothing).
* Blocks after ``layer``: every head gets a constant query component that meets a key component reading
  the artifact channel, so attention (CLS's included) sinks onto the high-norm tokens from ``layer + 1`` on.

Ground truth (:class:`PlantedTruth`, read with :func:`planted_truth`): the register neurons are ``neurons`` in block ``layer``; the high-norm
tokens are the patches with texture energy below ``tau / 2`` (``truth.artifact_mask(model, images)``);
perfectly flat patches (``E = 0``) always are, strongly textured ones never.
"""
from __future__ import annotations

from .models import (PLANTED_DINOV3_NAME, PLANTED_NAME, PLANTED_PVT_NAME, PLANTED_SWIN_NAME, planted_dinov3,
                     planted_pvt, planted_swin, planted_vit)
from .truth import PlantedPvtTruth, PlantedSwinTruth, PlantedTruth, planted_truth

PLANTED_BUILDERS = {PLANTED_NAME: planted_vit, PLANTED_DINOV3_NAME: planted_dinov3,
                    PLANTED_PVT_NAME: planted_pvt, PLANTED_SWIN_NAME: planted_swin}  # name -> builder (interp.load)

__all__ = ["PLANTED_BUILDERS", "PLANTED_DINOV3_NAME", "PLANTED_NAME", "PLANTED_PVT_NAME", "PLANTED_SWIN_NAME",
           "PlantedPvtTruth", "PlantedSwinTruth", "PlantedTruth", "planted_dinov3", "planted_pvt", "planted_swin",
           "planted_truth", "planted_vit"]
