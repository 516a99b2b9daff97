"""A live source whose model sees each whole image: resized to the model's input size with nothing cropped
(timm's ``crop_mode="squash"`` at ``crop_pct`` 1: the aspect ratio is not kept), for scoring a segmentation
on the full image instead of the centre crop.

>>> whole = whole_image_source(source)        # same files, ids and labels
>>> whole.data_config()["crop_mode"], whole.data_config()["crop_pct"]
('squash', 1.0)
"""
from __future__ import annotations

from typing import Sequence

import torch

from ...errors import InterpError
from ...models.inputs.preprocessing import decode_images
from ...runtime.live_source import LiveSource
from ...runtime.source import ActivationSource
from ...models.inputs.preprocessing import timm_transform


class WholeImageSource(LiveSource):
    """``source`` (a live source over image files) decoding them with its model's data config changed to
    ``crop_pct=1.0, crop_mode="squash"``; ``data_config()`` says so, so box and mask geometry follow it."""

    def __init__(self, source: LiveSource):
        if not isinstance(source, LiveSource) or source._paths is None or source._tensor is not None:
            raise InterpError("scoring the whole image (whole_image=True, CLI --whole-image) re-reads the image files without "
                              "the centre crop: give a live source over image files (CLI --images), not a cache "
                              "or a tensor")
        self.__dict__.update(source.__dict__)
        self._config = {**source.data_config(), "crop_pct": 1.0, "crop_mode": "squash"}

    def _decode(self, paths: Sequence) -> torch.Tensor:
        """Files that passed the up-front decode check, through the whole-image transform (one that fails now
        changed on disk since: it stops the run)."""
        pixels, _, _ = decode_images(paths, timm_transform(self._config), strict=True)
        return torch.stack(pixels)

    def with_interventions(self, *interventions) -> "WholeImageSource":
        copy = object.__new__(WholeImageSource)
        copy.__dict__.update(super().with_interventions(*interventions).__dict__)
        return copy


def whole_image_source(source: ActivationSource) -> WholeImageSource:
    """``source`` with its model seeing every whole image (module docstring); a source already so is returned."""
    return source if isinstance(source, WholeImageSource) else WholeImageSource(source)
