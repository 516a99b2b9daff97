"""The two runs a patching sweep compares (docs/causal.md): per batch, the clean and the corrupted run's images and
the interventions each runs under.

* ``image``: the next image of the batch; ``noise``: Gaussian noise added (seeded by the seed and the batch);
* ``region``: each image's region filled with the normalisation's mean colour (0) or with a Gaussian blur of the
  image, the region one box for every image (input pixels), each image's boxes from a box file or its mask file
  (original pixels, mapped through the model's preprocessing);
* ``registers``: the same images with the trained registers zeroed at every block's output (the clean run keeps
  them); ``test-time-register``: the clean run with a test-time register taking over the register neurons, the
  corrupted run without (its token exists in the clean run only: :func:`shared_rows`).

>>> from interp.studies.causal.configs import PatchingConfig
>>> corruption = make_corruption(source, PatchingConfig(corruption="region", boxes="boxes.csv", fill="blur"))
>>> corruption.region.shape                       # each photo's boxes in input pixels
torch.Size([4, 224, 224])
>>> runs = corruption.runs(images[:2], start=0)   # a batch whose first image is image 0
>>> runs.corrupted.shape, runs.corrupted_edits
(torch.Size([2, 3, 224, 224]), ())
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from ...errors import InterpError
from ...formats.box_files import checked_size, matched_entries, read_boxes
from ...formats.box_types import Box
from ...formats.masks import check_mask_size, mask_files, read_mask
from ...interventions.register import TestTimeRegister
from ...interventions.token_replacement import TokenReplacement, token_rows
from ...models.inputs.geometry import input_geometry, mask_to_input
from ...models.inputs.preprocessing import timm_transform
from ..core.pixels import gaussian_blur
from .configs import PatchingOptions


@dataclass(frozen=True)
class RunPair:
    """One batch's two runs: their images [b, 3, H, W] and the interventions each runs under (after the source's)."""

    clean: torch.Tensor
    corrupted: torch.Tensor
    clean_edits: Tuple = ()
    corrupted_edits: Tuple = ()


@dataclass(frozen=True)
class Corruption:
    """How a study's corrupted run differs from its clean one.

    Attributes:
        config: the study's options (``corruption``, ``noise``, ``fill``, ``seed``).
        region: bool [N or 1, H, W], the pixels a ``region`` corruption fills (image i's row, or one row for all).
        sigma: the blur's sigma in input pixels (``fill="blur"``).
        clean_edits, corrupted_edits: the interventions of each run (the register corruptions).
    """

    config: PatchingOptions
    region: Optional[torch.Tensor] = None
    sigma: Optional[float] = None
    clean_edits: Tuple = ()
    corrupted_edits: Tuple = ()

    def runs(self, x: torch.Tensor, start: int) -> RunPair:
        """The two runs of batch ``x`` [b, 3, H, W] (normalised pixels) whose first image is image ``start``."""
        config = self.config
        if config.corruption == "image":
            if len(x) < 2:
                raise InterpError("--corruption image pairs each image with the next one of its batch: a batch of one "
                                  "image has none; give an even number of images or a batch size that divides them")
            return RunPair(x, x.roll(-1, 0))
        if config.corruption == "noise":
            g = torch.Generator().manual_seed(config.seed * 1_000_003 + start)
            return RunPair(x, x + config.noise * torch.randn(x.shape, generator=g).to(x.device, x.dtype))
        if config.corruption == "region":
            return RunPair(x, self.fill_region(x, start))
        return RunPair(x, x, self.clean_edits, self.corrupted_edits)

    def notes(self, direction: str) -> Tuple[str, ...]:
        """What the result says about this corruption's cells (the test-time register's token, when noising)."""
        if self.config.corruption == "test-time-register" and direction == "noise":
            return ("the test-time register's token exists in the clean run only: the corrupted run has no value to "
                    "patch there, so its cells read no effect",)
        return ()

    def fill_region(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """``x`` with each image's region filled: the mean colour (0) or the blurred image."""
        region = self.region if len(self.region) == 1 else self.region[start:start + len(x)]
        if tuple(region.shape[-2:]) != tuple(x.shape[-2:]):
            raise InterpError(f"the region is {tuple(region.shape[-2:])} pixels but the images are "
                              f"{tuple(x.shape[-2:])}")
        fill = gaussian_blur(x, self.sigma) if self.config.fill == "blur" else torch.zeros_like(x)
        return torch.where(region[:, None].to(x.device), fill, x)


def box_pixels(box: Box, size: Tuple[int, int]) -> torch.Tensor:
    """The input pixels [H, W] (``size``) whose centres lie inside ``box`` (pixel edges, input pixels)."""
    h, w = size
    mask = torch.zeros(h, w, dtype=torch.bool)
    c0, c1 = max(0, math.ceil(box.x0 - 0.5)), min(w, math.ceil(box.x1 - 0.5))
    r0, r1 = max(0, math.ceil(box.y0 - 0.5)), min(h, math.ceil(box.y1 - 0.5))
    mask[r0:r1, c0:c1] = True
    return mask


def file_regions(source, boxes: Optional[str], masks: Optional[str]) -> torch.Tensor:
    """Each image's region in input pixels, bool [N, H, W], from a box file (the union of its boxes) or a folder
    of mask files (``<image stem>.png``), both in original pixels; an image without one is refused."""
    ids = list(source.ids)
    transform = timm_transform(source.data_config())
    size = tuple(source.image_size)
    out = torch.zeros(len(ids), *size, dtype=torch.bool)
    if boxes is not None:
        for i, (image_id, entry) in enumerate(zip(ids, matched_entries(ids, read_boxes(boxes)))):
            if entry is not None and entry.boxes:
                geometry = input_geometry(transform, checked_size(image_id, entry))
                for box in (geometry.to_input(b) for b in entry.boxes):
                    if box is not None:
                        out[i] |= box_pixels(box, size)
    else:
        files = mask_files(masks)
        for i, image_id in enumerate(ids):
            path = files.get(Path(image_id).stem)
            if path is not None:
                mask = read_mask(path)  # [H0, W0]
                check_mask_size(mask.shape, image_id, f"mask {str(path)!r}")
                out[i] = mask_to_input(mask, input_geometry(transform, (mask.shape[1], mask.shape[0])))
    _refuse_empty(ids, out, "--boxes " + str(boxes) if boxes is not None else "--masks " + str(masks))
    return out


def _refuse_empty(ids: Sequence[str], region: torch.Tensor, where: str) -> None:
    empty: List[str] = [i for i, r in zip(ids, region) if not bool(r.any())]
    if empty:
        raise InterpError(f"{len(empty)} image(s) have no region in the input from {where} (e.g. {empty[0]!r}: no "
                          "box or mask, or it is cropped away): give every image one, or leave those images out")


def make_corruption(source, config: PatchingOptions) -> Corruption:
    """The :class:`Corruption` of ``config`` on ``source`` (box and mask files read, register edits built)."""
    if config.corruption == "region":
        if config.box is not None:
            x0, y0, x1, y1 = config.box
            h, w = source.image_size
            if x1 > w or y1 > h:
                raise InterpError(f"--box {x0},{y0},{x1},{y1} reaches past the {w}x{h} input")
            region = box_pixels(Box(x0, y0, x1, y1), (h, w))[None]
        else:
            region = file_regions(source, config.boxes, config.masks)
        sigma = config.blur_sigma if config.blur_sigma is not None else source.patch_size[0] / 2.0
        return Corruption(config, region=region, sigma=float(sigma) if config.fill == "blur" else None)
    if config.corruption == "registers":
        layout = source.layout
        if layout.n_registers == 0:
            raise InterpError(f"--corruption registers zeroes the trained registers: {source.model_name} has none "
                              "(--corruption test-time-register --register-neurons L:N,... adds one)")
        return Corruption(config, corrupted_edits=(TokenReplacement(token_rows(layout, "registers"), "zero"),))
    if config.corruption == "test-time-register":
        return Corruption(config, clean_edits=(TestTimeRegister(config.register_neurons),))
    return Corruption(config)


def shared_rows(donor, base) -> Tuple[List[int], List[int]]:
    """(donor rows, base rows) of the tokens two runs' layouts both have: the class tokens and trained registers,
    then the patches; a test-time register (``n_extra``) that one run has and the other has not is left out."""
    own_d, own_b = donor.n_prefix - donor.n_extra, base.n_prefix - base.n_extra
    if own_d != own_b or donor.n_patches != base.n_patches:
        raise InterpError("the clean and corrupted runs have different tokens: patching needs the same image size")
    shared = min(donor.n_extra, base.n_extra)  # test-time registers both runs have
    prefix = list(range(own_d + shared))
    return (prefix + list(range(donor.n_prefix, donor.n_prefix + donor.n_patches)),
            prefix + list(range(base.n_prefix, base.n_prefix + base.n_patches)))


def aligned(donor: torch.Tensor, base: torch.Tensor, donor_layout, base_layout) -> torch.Tensor:
    """The donor's values [b, t_donor, ...] on the base run's token rows [b, t_base, ...]: the rows both runs have
    taken from the donor, a token only the base run has keeps its base value (patching it changes nothing)."""
    if donor.shape == base.shape:
        return donor
    rows_d, rows_b = shared_rows(donor_layout, base_layout)
    out = base.clone()
    out[:, rows_b] = donor[:, rows_d].to(out.dtype)
    return out
