"""LOST protocol ``"lost"``: the reference's own images, boxes and CorLoc (docs/methods.md section 5).

``valeoai/LOST`` at commit c0ff67ba3baf (``datasets.py`` ``transform``, ``extract_gt_VOC``, ``extract_gt_COCO``,
``bbox_iou``; ``main_lost.py``; ``object_discovery.py`` ``detect_box``), per image:

* input: the whole image at its own resolution, ``ToTensor`` + ``Normalize`` with ImageNet's mean and std
  (:data:`LOST_MEAN`, :data:`LOST_STD`, whatever the model's own), then zero-padded on the right and bottom to
  the next multiple of the patch size (no resize, no crop), one image per forward. The model's position table is
  resampled for that image's grid as DINO does (:mod:`interp.models.weights.pos_table`);
* box: the seed component's cells times the patch size, ``x1`` and ``y1`` clipped to the image's width and
  height (the padding is never part of a box);
* ground truth: VOC XML ``xmin - 1, ymin - 1, xmax, ymax``; COCO without crowd boxes, corners rounded to whole
  pixels (``read_boxes(path, convention="lost")``);
* CorLoc: a hit when the box has IoU >= 0.5 with any ground-truth box, IoU as ``bbox_iou`` computes it
  (:func:`lost_iou`: float32, no +1 pixel, ``eps = 1e-7`` added to both heights and to the union).

Images are decoded by :func:`interp.models.inputs.preprocessing.open_image` (the reference's ``convert("RGB")``; a
transparent image is composited on white first).

>>> from PIL import Image
>>> Image.new("RGB", (500, 375)).save("a.png")
>>> x, size = lost_input("a.png", 16)                    # Tensor[3, Hp, Wp] (padded), original (W, H)
>>> tuple(x.shape), size
((3, 384, 512), (500, 375))
>>> lost_box([0, 0, 32, 24], 16, (500, 375))            # cells -> pixels, clipped to the image
[0.0, 0.0, 500.0, 375.0]
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from PIL import Image

from ..._progress import tqdm
from ...errors import InterpError, UsageError
from ...models.inputs.preprocessing import open_image
from ...runtime.live_source import LiveSource
from ...runtime.source import ActivationSource

LOST_MEAN = (0.485, 0.456, 0.406)
LOST_STD = (0.229, 0.224, 0.225)
LOST_IOU_EPS = 1e-7
MAX_PATCHES = 10_000  # the affinity matrix is [P, P] float64: 10,000 patches hold 800 MB


def lost_input(path, patch_size: int) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """One image file as LOST feeds it: ``(pixels [3, Hp, Wp] float32, original (width, height))``, with
    ``Hp``, ``Wp`` the height and width rounded up to multiples of ``patch_size`` (zeros after normalising)."""
    im = open_image(path)
    width, height = im.size
    x = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).reshape(height, width, 3)
    x = x.permute(2, 0, 1).float().div(255)  # torchvision's ToTensor
    mean, std = torch.tensor(LOST_MEAN).view(3, 1, 1), torch.tensor(LOST_STD).view(3, 1, 1)
    x = (x - mean) / std
    hp, wp = -(-height // patch_size) * patch_size, -(-width // patch_size) * patch_size
    padded = torch.zeros(3, hp, wp)
    padded[:, :height, :width] = x
    return padded, (width, height)


def display_image(path, patch_size: int):
    """The image as the protocol's model saw it, for figures: a PIL RGB image of the padded size, the padding
    in ImageNet's mean colour (what zeros after normalising are)."""
    im = open_image(path)
    width, height = im.size
    hp, wp = -(-height // patch_size) * patch_size, -(-width // patch_size) * patch_size
    canvas = Image.new("RGB", (wp, hp), tuple(round(255 * m) for m in LOST_MEAN))
    canvas.paste(im, (0, 0))
    return canvas


def lost_box(box_cells: Sequence[int], patch_size: int, image_size: Tuple[int, int]) -> List[float]:
    """A cell box ``[x0, y0, x1, y1]`` (end exclusive) -> original pixels as LOST's ``detect_box``: times the
    patch size, ``x1`` / ``y1`` clipped to the image's ``(width, height)``."""
    x0, y0, x1, y1 = (int(v) * patch_size for v in box_cells)
    width, height = image_size
    return [float(x0), float(y0), float(min(x1, width)), float(min(y1, height))]


def lost_iou(box: Sequence[float], gt: Sequence[Sequence[float]]) -> List[float]:
    """IoU of one box with each ground-truth box [n, 4], LOST's ``bbox_iou`` arithmetic (float32, ``eps``)."""
    if not len(gt):
        return []
    b1 = torch.tensor(box, dtype=torch.float32)
    b2 = torch.tensor([list(g) for g in gt], dtype=torch.float32).T
    inter = ((torch.min(b1[2], b2[2]) - torch.max(b1[0], b2[0])).clamp(0)
             * (torch.min(b1[3], b2[3]) - torch.max(b1[1], b2[1])).clamp(0))
    w1, h1 = b1[2] - b1[0], b1[3] - b1[1] + LOST_IOU_EPS
    w2, h2 = b2[2] - b2[0], b2[3] - b2[1] + LOST_IOU_EPS
    union = w1 * h1 + w2 * h2 - inter + LOST_IOU_EPS
    return (inter / union).tolist()


def lost_hits(pred: Sequence[Optional[Sequence[float]]], gt: Sequence[Sequence[Sequence[float]]],
              iou: float = 0.5) -> List[Optional[bool]]:
    """Per image: a hit when :func:`lost_iou` reaches ``iou`` with any ground-truth box; None (not evaluated)
    without a ground-truth box (the reference has no such image: its IoU call fails on an empty list)."""
    return [None if p is None or not boxes else any(v >= iou for v in lost_iou(p, boxes))
            for p, boxes in zip(pred, gt)]


def lost_protocol_source(source: ActivationSource) -> LiveSource:
    """``source`` checked for the protocol: a live source over image files with no other preprocessing."""
    if not isinstance(source, LiveSource) or source.ids and not source.reads_files:
        raise InterpError("protocol='lost' reads each image file at full resolution: give a live source over "
                          "image files (CLI --images DIR), not a cache or a tensor")
    if source.transform is not None:  # an option that cannot go with protocol="lost" (the CLI exits 2)
        raise UsageError(f"protocol='lost' feeds full-resolution images (no resize or crop); the source was "
                          f"opened with {source.transform.name}: leave --resize/--crop/--transform out")
    return source


def pos_table_options(source) -> dict:
    """How the position table is resampled per image: DINOv2's ``_reg`` models antialias without the offset;
    every other model as DINO (offset 0.1, no antialias). -> kwargs of :func:`interp.models.weights.pos_table.input_grid`."""
    name = str(source.model_name)
    if "dinov2" in name and source.layout.n_registers > 0:
        return {"offset": None, "antialias": True}
    return {"offset": 0.1, "antialias": False}


def lost_protocol_features(source: LiveSource, hook: str, features, progress: bool = False):
    """Run the source's model on each image file as LOST does, one at a time.

    Args:
        hook: the key hook to read (``blocks.N.attn.hook_k``).
        features: ``(keys [b, t, h, dh], layout) -> patch features [b, P, D]`` (the model protocol's own).

    Yields:
        (patch features [P, D], grid (h, w), original (width, height)) per image, in ``source.ids`` order.
    """
    patch = int(source.patch_size[0])
    if tuple(source.patch_size) != (patch, patch):
        raise InterpError("protocol='lost' pads to a multiple of a square patch; this model's patches are "
                          f"{tuple(source.patch_size)}")
    options = pos_table_options(source)
    for path in tqdm(source.ids, disable=not progress, desc="LOST (full resolution)", unit="image", leave=False):
        x, size = lost_input(path, patch)
        grid = (x.shape[1] // patch, x.shape[2] // patch)
        if grid[0] * grid[1] > MAX_PATCHES:
            raise InterpError(f"image {path!r} ({size[0]} x {size[1]}) has {grid[0] * grid[1]:,} patches, more "
                              f"than {MAX_PATCHES:,} for LOST's [P, P] affinity; downscale it")
        run = source.run_at_grid(x[None], [hook], grid, **options)
        yield features(run.acts[hook], run.layout)[0], grid, size
