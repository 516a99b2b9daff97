"""The activation source over an HDF5 cache written by ``interp cache`` (the live one is in ``source.py``)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from ..errors import InterpError
from ..hooks.names import BlockNames
from ..models.layout import TokenLayout
from ..models.inputs.preprocessing import decode_images, timm_transform, transform_name
from .forward import Reducers, resolve_reducers
from .source import ActivationSource, Batch, token_norms


def stored_layout(layout: TokenLayout, rows: Optional[Sequence[int]]) -> TokenLayout:
    """Layout of the token rows a cache kept (``--tokens``): all rows, patches only, or prefix rows only."""
    if rows is None or tuple(rows) == (0, layout.n_tokens):
        return layout
    start, stop = int(rows[0]), int(rows[1])
    if (start, stop) == (layout.n_prefix, layout.n_tokens):
        return replace(layout, n_prefix=0, n_registers=0, cls_index=None, n_extra=0)
    has_cls = layout.cls_index is not None and start <= layout.cls_index < stop
    return TokenLayout(n_prefix=stop - start, n_registers=max(0, stop - start - int(has_cls)),
                       cls_index=0 if has_cls else None, grid=(0, 0))


class CacheSource(ActivationSource):
    """Reads an HDF5 activation cache written by ``interp cache`` lazily, one batch at a time."""

    def __init__(self, reader, model=None):
        self.reader = reader
        self._weights_model = model  # the model ``reader`` was checked against (``weights_model``)
        meta = reader.meta
        self.model_name = meta.get("model_name", "?")
        self.fingerprint = meta.get("weights_fingerprint", "?")
        self.hook_names = list(reader.hooks)
        self.ids = list(reader.ids)
        self.layout = stored_layout(reader.layout, meta.get("token_rows"))
        # a duck-typed reader (tests' constructed caches) may name no blocks: blocks.0 .. of its depth
        self.blocks = getattr(reader, "blocks", None) or BlockNames.flat(int(reader.model_depth))
        self.norms_only = bool(meta.get("norms_only", False))
        self.skipped = [(path, reason) for _, path, reason in getattr(reader, "skipped", [])]

    @property
    def weights_model(self):
        """The model the cache was opened with (checked against its fingerprint), or None."""
        return self._weights_model

    def data_config(self) -> dict:
        cfg = self.reader.meta.get("data_config")
        if cfg is None:
            raise InterpError("this cache does not record its data config; run with --images and the model instead")
        return dict(cfg)

    def image_files(self, limit: int) -> Optional[List[Path]]:
        """The files of the first ``limit`` images when the cache's ids are image files here and it records the
        preprocessing they went through; None otherwise (a cache written from tensors, or moved)."""
        paths = [Path(i) for i in self.reader.ids[:limit]]
        if not paths or self.reader.meta.get("data_config") is None or not all(p.is_file() for p in paths):
            return None
        return paths

    @property
    def shows_images(self) -> bool:
        return self.image_files(1) is not None

    def display_images(self, limit: int = 8) -> torch.Tensor:
        """The first ``limit`` images decoded again from their files with the cache's recorded preprocessing,
        normalisation undone, in 0..1: Tensor[n, 3, H, W] (the figures of a cached run show the images)."""
        paths = self.image_files(limit)
        if paths is None:
            return super().display_images(limit)  # raises: no images to show
        cfg = self.data_config()
        cfg.pop("preprocess", None)
        tensors, kept, _ = decode_images(paths, timm_transform(cfg))
        if len(kept) != len(paths):
            raise InterpError("the cache's image files are no longer all readable here; the figures show ids")
        mean = torch.tensor(cfg["mean"], dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(cfg["std"], dtype=torch.float32).view(1, 3, 1, 1)
        return (torch.stack(tensors).float() * std + mean).clamp(0, 1)

    @property
    def preprocess(self) -> str:
        """The preprocessing the cache's images went through (``"model"`` for a cache that does not say)."""
        return transform_name(self.reader.meta.get("data_config") or {})

    @property
    def image_size(self) -> Tuple[int, int]:
        meta = self.reader.meta
        size = meta.get("input_size") or meta.get("data_config", {}).get("input_size")
        if size is None:
            raise InterpError("cannot tell the image size of this source (no input size in the cache)")
        return tuple(int(v) for v in list(size)[-2:])

    def batches(self, hooks: Sequence[str], batch_size: int = 16,
                reduce: Reducers = None, interventions: Sequence = ()) -> Iterator[Batch]:
        if interventions:
            raise InterpError("a cache holds the activations of one run; interventions need a live source "
                              "(open_source(model=..., images=...); CLI --images)")
        self.require(hooks)
        hooks = list(hooks)
        reduce = resolve_reducers(reduce, self.layout)
        for start in range(0, len(self.ids), batch_size):
            stop = min(start + batch_size, len(self.ids))
            acts = {}
            for h in hooks:
                a = torch.as_tensor(self.reader[h][start:stop]).float()
                fn = reduce.get(h)
                if fn is not None and self.norms_only and fn is not token_norms:
                    raise InterpError(f"this cache stores token norms only; {h} is needed in full: "
                                      "write the cache without --norms-only")
                acts[h] = a if fn is None or (self.norms_only and fn is token_norms) else fn(a)
            yield Batch(self.ids[start:stop], start, acts, self.layout,
                        set(hooks) if self.norms_only else set(), blocks=self.blocks)
