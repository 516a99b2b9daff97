"""The HDF5 datasets of a cache file (docs/cache-format.md): created empty and resizable along the image axis,
chunked one batch at a time, then grown by appended rows. Used by the writer (:mod:`interp.cache.store`) and by
the merge of torchrun shards (:mod:`interp.cache.distributed`)."""
from __future__ import annotations

from typing import Dict, Tuple

import h5py
import numpy as np

from .format import CHECKSUMS, IDS, INDEX, SKIPPED, SKIPPED_FIELDS, acts_path, write_attrs

_STR = h5py.string_dtype("utf-8")
ID_CHUNK = 1024
_SKIPPED_CHUNK = 64
_MAX_CHUNK_BYTES = 1 << 30  # HDF5 chunks must stay under 4 GiB; keep them well below


def _compression_kwargs(compression: str) -> dict:
    if compression == "none":
        return {}
    if compression == "lzf":
        return {"compression": "lzf", "shuffle": True}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    raise ValueError(f"compression must be none, lzf or gzip, got {compression!r}")


def chunk_rows(meta: dict, shape: Tuple[int, ...]) -> int:
    """Rows per chunk: one batch, but never more rows than images (HDF5 allocates whole chunks, so a
    32-row chunk for 4 images would make the file 8x its data) nor more than 1 GiB."""
    row_bytes = max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(meta["dtype"]).itemsize)
    return max(1, min(int(meta["batch_size"]), int(meta["n_images"]), _MAX_CHUNK_BYTES // row_bytes))


def create_row_datasets(h5: h5py.File, meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> None:
    """Empty ``/acts/<hook>`` datasets [0, *shape], resizable along N, one batch per chunk, and the
    ``/checksums`` dataset [0, hooks + 1]."""
    np_dtype = np.dtype(meta["dtype"])
    extra = _compression_kwargs(meta["compression"])
    for hook in meta["hooks"]:
        shape = tuple(shapes[hook])
        h5.create_dataset(acts_path(hook), shape=(0, *shape), maxshape=(None, *shape), dtype=np_dtype,
                          chunks=(chunk_rows(meta, shape), *shape), **extra)
    width = len(meta["hooks"]) + 1
    h5.create_dataset(CHECKSUMS, shape=(0, width), maxshape=(None, width), dtype=np.uint32,
                      chunks=(ID_CHUNK, width))


def create_index_datasets(h5: h5py.File) -> None:
    """Empty ``/ids``, ``/index`` and ``/skipped/{index,path,reason}`` datasets, resizable."""
    h5.create_dataset(IDS, shape=(0,), maxshape=(None,), dtype=_STR, chunks=(ID_CHUNK,))
    h5.create_dataset(INDEX, shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(ID_CHUNK,))
    for name, dtype in zip(SKIPPED_FIELDS, (np.int64, _STR, _STR)):
        h5.create_dataset(f"{SKIPPED}/{name}", shape=(0,), maxshape=(None,), dtype=dtype, chunks=(_SKIPPED_CHUNK,))


def create_layout(h5: h5py.File, meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> None:
    """Every dataset of a new cache file, empty, and its attributes ``meta``."""
    create_row_datasets(h5, meta, shapes)
    create_index_datasets(h5)
    write_attrs(h5, meta)


def append_rows(ds: h5py.Dataset, values) -> None:
    """Grow ``ds`` along its first axis by ``values``."""
    if len(values) == 0:
        return
    n = ds.shape[0]
    ds.resize(n + len(values), axis=0)
    ds[n:] = values
