"""The HDF5 side of writing a cache: create a file, append committed batches, resume after a crash.

Crash safety rests on three rules:

1. The file is written in HDF5 SWMR mode (HDF5 1.10 format). SWMR orders every metadata write so the
   file on disk is always a consistent HDF5 file, whenever the process is killed.
2. Each batch is committed in two steps: write its rows (and skipped entries), flush; then bump the
   ``n_written`` attribute, flush. Rows past ``n_written`` are never trusted.
3. A new file is built under a temporary name and renamed into place once it is in SWMR mode, so the
   final path only ever names a consistent file. A file left by a killed writer still carries HDF5's
   "open for write" flag, which forbids reopening it for writing: resume then copies its committed rows
   into a fresh file and renames that over it.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

import h5py
import numpy as np

from ..errors import CacheError
from .format import (ACTS, IDS, INDEX, LIBVER, SKIPPED, SKIPPED_FIELDS, acts_path, check_version,
                     committed_skipped, read_attrs, resume_position, settings_mismatch, write_attrs)

_STR = h5py.string_dtype("utf-8")
_ID_CHUNK = 1024
_SKIPPED_CHUNK = 64
_MAX_CHUNK_BYTES = 1 << 30  # HDF5 chunks must stay under 4 GiB; keep them well below


@dataclass
class BatchRows:
    """One batch ready to store: its rows, and the images of the batch that were skipped.

    Attributes:
        arrays: hook -> ndarray[b, ...] in the stored dtype.
        ids: id of each of the b rows.
        positions: input position of each row.
        skipped: (position, id, reason) per unreadable image of the batch.
        stop: input position after the batch.
    """

    arrays: Dict[str, np.ndarray]
    ids: List[str]
    positions: List[int]
    skipped: List[Tuple[int, str, str]] = field(default_factory=list)
    stop: int = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def tmp_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


def _compression_kwargs(compression: str) -> dict:
    if compression == "none":
        return {}
    if compression == "lzf":
        return {"compression": "lzf", "shuffle": True}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    raise ValueError(f"compression must be none, lzf or gzip, got {compression!r}")


def create_row_datasets(h5: h5py.File, meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> None:
    """Empty ``/acts/<hook>`` datasets [0, *shape], resizable along N, one batch per chunk."""
    np_dtype = np.dtype(meta["dtype"])
    extra = _compression_kwargs(meta["compression"])
    for hook in meta["hooks"]:
        shape = tuple(shapes[hook])
        row_bytes = max(1, int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize)
        chunk_rows = max(1, min(int(meta["batch_size"]), _MAX_CHUNK_BYTES // row_bytes))
        h5.create_dataset(acts_path(hook), shape=(0, *shape), maxshape=(None, *shape), dtype=np_dtype,
                          chunks=(chunk_rows, *shape), **extra)


def create_index_datasets(h5: h5py.File) -> None:
    """Empty ``/ids``, ``/index`` and ``/skipped/{index,path,reason}`` datasets, resizable."""
    h5.create_dataset(IDS, shape=(0,), maxshape=(None,), dtype=_STR, chunks=(_ID_CHUNK,))
    h5.create_dataset(INDEX, shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(_ID_CHUNK,))
    for name, dtype in zip(SKIPPED_FIELDS, (np.int64, _STR, _STR)):
        h5.create_dataset(f"{SKIPPED}/{name}", shape=(0,), maxshape=(None,), dtype=dtype, chunks=(_SKIPPED_CHUNK,))


def _create_layout(h5: h5py.File, meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> None:
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


class CacheFile:
    """A cache file open for writing in SWMR mode. Create with :meth:`create` or :meth:`resume`."""

    def __init__(self, h5: h5py.File, path: Path, position: int):
        self.h5 = h5
        self.path = path
        self.meta = read_attrs(h5)
        self.n_written = int(self.meta["n_written"])
        self.position = position  # next input position to process
        self.n_skipped = int(h5[f"{SKIPPED}/index"].shape[0])
        self.acts = {hook: h5[acts_path(hook)] for hook in self.meta["hooks"]}
        self.row_shapes = {hook: tuple(ds.shape[1:]) for hook, ds in self.acts.items()}
        self._direct_chunks = self.meta["compression"] == "none"

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, path, meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> "CacheFile":
        """A new, empty cache at ``path`` (replacing any file there only once the new one is ready)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_path(path)
        h5 = h5py.File(tmp, "w", libver=LIBVER)
        try:
            _create_layout(h5, meta, shapes)
            h5.flush()
            h5.swmr_mode = True
            os.replace(tmp, path)
        except BaseException:
            h5.close()
            tmp.unlink(missing_ok=True)
            raise
        return cls(h5, path, 0)

    @classmethod
    def resume(cls, path, run_meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> "CacheFile":
        """Reopen ``path`` to continue it after its last committed batch.

        Raises:
            CacheError: the file is not a cache of this version, or was written with other settings
                (model, hooks, dtype, tokens, norms_only, images).
        """
        path = Path(path)
        for stale in path.parent.glob(f"{path.name}.tmp-*"):  # left by a writer killed while creating
            stale.unlink(missing_ok=True)
        try:
            h5 = h5py.File(path, "r+", libver=LIBVER)
        except OSError as e:
            # A killed writer's "open for write" flag, or another process holding the file open (HDF5 file
            # lock): never modify it in place; copy its committed rows into a fresh file instead.
            killed = "already open for write" in str(e)
            return cls._recover(path, run_meta, shapes, "was left open by a writer that stopped without closing it"
                                if killed else "is open in another process")
        try:
            cls._check(h5, path, run_meta, shapes)
            n, position = cls._committed(h5)
            for ds in list(h5[ACTS].values()) + [h5[IDS], h5[INDEX]]:
                ds.resize(n, axis=0)
            n_skipped = committed_skipped(h5, position)
            for name in SKIPPED_FIELDS:
                h5[f"{SKIPPED}/{name}"].resize(n_skipped, axis=0)
            h5.attrs["complete"] = False
            h5.flush()
            h5.swmr_mode = True
        except BaseException:
            h5.close()
            raise
        return cls(h5, path, position)

    @staticmethod
    def _check(h5: h5py.File, path: Path, run_meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> None:
        meta = read_attrs(h5)
        check_version(meta, path)
        problems = settings_mismatch(meta, run_meta)
        if not problems:
            for hook in meta["hooks"]:
                if tuple(h5[acts_path(hook)].shape[1:]) != tuple(shapes[hook]):
                    problems.append(f"{hook}: file rows are {h5[acts_path(hook)].shape[1:]}, "
                                    f"this run's are {shapes[hook]}")
        if problems:
            raise CacheError(
                f"cannot resume {str(path)!r}: it was written with other settings ({'; '.join(problems)}). "
                "Rerun with the settings it was written with, or pass --overwrite (overwrite=True) to start over."
            )

    @staticmethod
    def _committed(h5: h5py.File) -> Tuple[int, int]:
        """(committed rows, next input position) of an open file."""
        n = int(h5.attrs["n_written"])
        index = h5[INDEX][:n]
        return n, resume_position(index, n, int(h5.attrs["batch_size"]), int(h5.attrs["n_images"]))

    @classmethod
    def _recover(cls, path: Path, run_meta: dict, shapes: Dict[str, Tuple[int, ...]], why: str) -> "CacheFile":
        """Copy the committed part of ``path`` into a fresh file and rename that over it."""
        try:
            old = h5py.File(path, "r", swmr=True)
        except OSError as e:
            raise CacheError(f"cannot open {str(path)!r} to resume it ({e}). If another process holds it open, "
                             "close that; if the file is damaged, delete it and rerun without --resume.") from e
        with old:
            cls._check(old, path, run_meta, shapes)
            meta = read_attrs(old)
            n, position = cls._committed(old)
            n_skipped = committed_skipped(old, position)
            meta.update(n_written=n, n_skipped=n_skipped, complete=False)
            tmp = tmp_path(path)
            new = h5py.File(tmp, "w", libver=LIBVER)
            try:
                _create_layout(new, meta, {h: old[acts_path(h)].shape[1:] for h in meta["hooks"]})
                for hook in meta["hooks"]:
                    src, dst = old[acts_path(hook)], new[acts_path(hook)]
                    dst.resize(n, axis=0)
                    step = dst.chunks[0]
                    for i in range(0, n, step):
                        dst[i:min(n, i + step)] = src[i:min(n, i + step)]
                for name in (IDS, INDEX):
                    append_rows(new[name], old[name][:n])
                for name in SKIPPED_FIELDS:
                    append_rows(new[f"{SKIPPED}/{name}"], old[f"{SKIPPED}/{name}"][:n_skipped])
                new.flush()
                new.swmr_mode = True
            except BaseException:
                new.close()
                tmp.unlink(missing_ok=True)
                raise
        os.replace(tmp, path)
        warnings.warn(f"{str(path)!r} {why}: copied its {n} committed rows into a fresh file; "
                      f"continuing from image {position}.")
        return cls(new, path, position)

    # ------------------------------------------------------------------ writing
    def append(self, batch: BatchRows) -> None:
        """Store one batch and commit it (rows first, then the ``n_written`` bump, each flushed)."""
        b = len(batch.ids)
        if b:
            for hook, ds in self.acts.items():
                self._write_rows(ds, self.n_written, batch.arrays[hook])
            append_rows(self.h5[IDS], batch.ids)
            append_rows(self.h5[INDEX], np.asarray(batch.positions, dtype=np.int64))
        if batch.skipped:
            for name, values in zip(SKIPPED_FIELDS, zip(*batch.skipped)):
                append_rows(self.h5[f"{SKIPPED}/{name}"], list(values))
            self.n_skipped += len(batch.skipped)
        self.h5.flush()
        if b:
            self.n_written += b
            self.h5.attrs["n_written"] = self.n_written
            self.h5.flush()
        self.position = batch.stop

    def _write_rows(self, ds: h5py.Dataset, start: int, values: np.ndarray) -> None:
        """Rows ``[start, start + len(values))`` of ``ds`` (grown to fit). A whole uncompressed chunk goes
        straight to the file (``H5Dwrite_chunk`` skips HDF5's selection machinery: ~40 % less CPU)."""
        ds.resize(start + len(values), axis=0)
        rows = ds.chunks[0]
        if self._direct_chunks and start % rows == 0 and len(values) == rows:
            values = np.ascontiguousarray(values, dtype=ds.dtype)
            ds.id.write_direct_chunk((start,) + (0,) * (ds.ndim - 1), values)
        else:
            ds[start:] = values

    def close(self, complete: bool = False) -> None:
        """Record ``n_skipped`` (and ``complete`` for a run that processed every image) and close."""
        if not self.h5.id.valid:
            return
        try:
            self.h5.attrs["n_skipped"] = self.n_skipped
            if complete:
                self.h5.attrs["complete"] = True
            self.h5.flush()
        finally:
            self.h5.close()

