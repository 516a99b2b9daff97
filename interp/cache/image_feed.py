"""Where the images of a cache run come from: image files (decoded on demand) or an in-memory batch.

A source has a fixed, ordered list of ids and loads any contiguous range ``[start, stop)`` into pixels,
reporting the images it could not read instead of failing (unless strict).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from ..errors import ImageError
from ..models.inputs.preprocessing import ImagesSpec, decode_images, tensor_image_id
from .format import images_digest


@dataclass
class LoadedBatch:
    """Images ``[start, stop)`` of a source.

    Attributes:
        pixels: Tensor[b, 3, H, W] of the readable images (None when none was readable).
        positions: input position of each row of ``pixels`` (relative to the source).
        skipped: (position, id, reason) for each image that could not be read.
    """

    start: int
    stop: int
    pixels: torch.Tensor = None
    positions: List[int] = field(default_factory=list)
    skipped: List[Tuple[int, str, str]] = field(default_factory=list)


class ImageFeed:
    """An ordered list of images. Subclasses set ``ids`` and implement ``load`` and ``subset``."""

    ids: List[str]
    input_size: Tuple[int, int]
    data_config: Optional[dict] = None  # the preprocessing the images get, when not the model's own

    def __len__(self) -> int:
        return len(self.ids)

    def digest(self) -> str:
        return images_digest(self.ids)

    def load(self, start: int, stop: int) -> LoadedBatch:
        raise NotImplementedError

    def subset(self, start: int, stop: int) -> "ImageFeed":
        raise NotImplementedError


class FileImages(ImageFeed):
    """Image files read with the model's timm preprocessing. Unreadable files are skipped (or raise if strict)."""

    def __init__(self, paths: Sequence[Path], transform, input_size: Tuple[int, int], strict: bool = False,
                 data_config: Optional[dict] = None):
        self.data_config = data_config
        self.paths = [Path(p) for p in paths]
        self.ids = [str(p) for p in self.paths]
        self.transform = transform
        self.input_size = tuple(input_size)
        self.strict = strict

    def load(self, start: int, stop: int) -> LoadedBatch:
        batch = LoadedBatch(start, stop)
        tensors, kept, unreadable = decode_images(self.paths[start:stop], self.transform, self.strict)
        batch.positions = [start + i for i in kept]
        batch.skipped = [(start + i, self.ids[start + i], reason) for i, reason in unreadable]
        if tensors:
            batch.pixels = torch.stack(tensors)
        return batch

    def digest(self) -> str:
        """sha256 of what the images are: each path and every byte of its file, in order (a resume over files
        whose contents changed under the same names is refused with it; ids alone kept the old rows)."""
        h = hashlib.sha256()
        for path in self.paths:
            h.update(str(path).encode("utf-8") + b"\0")
            try:
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
            except OSError as e:  # unreadable now: the run skips it and says so
                h.update(f"unreadable: {e.errno}".encode())
            h.update(b"\0")
        return h.hexdigest()

    def subset(self, start: int, stop: int) -> "FileImages":
        return FileImages(self.paths[start:stop], self.transform, self.input_size, self.strict, self.data_config)


class TensorImages(ImageFeed):
    """An already preprocessed Tensor[N, 3, H, W]; ids are ``tensor:<i>``."""

    def __init__(self, pixels: torch.Tensor, offset: int = 0):
        if pixels.ndim != 4:
            raise ImageError(f"expected images as Tensor[N, C, H, W], got shape {tuple(pixels.shape)}")
        self.pixels = pixels
        self.ids = [tensor_image_id(offset + i) for i in range(pixels.shape[0])]
        self.input_size = tuple(int(s) for s in pixels.shape[-2:])
        self.offset = offset

    def digest(self) -> str:
        # Ids alone do not tell two tensors apart; add the shape and a strided sample of every image's
        # pixels (cheap even for thousands of images) so resuming with other pixels fails.
        sample = self.pixels.detach().reshape(self.pixels.shape[0], -1)[:, ::97].float().cpu().numpy()
        return images_digest(self.ids, str(tuple(self.pixels.shape)).encode() + sample.tobytes())

    def load(self, start: int, stop: int) -> LoadedBatch:
        return LoadedBatch(start, stop, self.pixels[start:stop], list(range(start, stop)))

    def subset(self, start: int, stop: int) -> "TensorImages":
        return TensorImages(self.pixels[start:stop], self.offset + start)




def image_feed(images: ImagesSpec, model, strict: bool = False, preprocess=None) -> ImageFeed:
    """An :class:`ImageFeed` for a directory, a ``.txt``/``.lst`` list file, a list of paths or a Tensor.
    ``preprocess``: files are decoded with that eval transform (:class:`~interp.models.inputs.preprocessing.EvalTransform`
    or its name) instead of the model's own; its ``data_config`` is what the cache records."""
    from ..models import data_config, eval_transform, list_images, preprocessing

    transform = eval_transform(preprocess)
    if isinstance(images, torch.Tensor):
        if transform is not None:
            raise ImageError(f"preprocess={transform.name!r} decodes image files; a tensor is already preprocessed")
        return TensorImages(images)
    paths = list_images(images)
    if not paths:
        raise ImageError("no image paths given")
    config = data_config(model, transform)
    input_size = tuple(int(s) for s in config["input_size"][-2:])
    return FileImages(paths, preprocessing(model, transform), input_size, strict=strict,
                      data_config=config if transform is not None else None)
