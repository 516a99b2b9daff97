"""The HDF5 side of writing a cache: create a file, append committed batches, resume after a crash.

Crash safety rests on four rules:

1. The file is written in HDF5 SWMR mode (HDF5 1.10 format). SWMR orders every metadata write so the
   file on disk is always a consistent HDF5 file, whenever the process is killed.
2. Each batch is committed in two steps: write its rows, their checksums (and skipped entries), flush;
   then bump the ``n_written`` attribute, flush. Rows past ``n_written`` are never trusted.
3. A new file is built under a temporary name and renamed into place once it is in SWMR mode, so the
   final path only ever names a consistent file. When it replaces an existing file (overwrite), the
   rename waits until the new run is complete: a failed or killed run leaves the old file as it was.
4. Resume first checks the file read-only (length against its superblock, attributes, dataset lengths,
   every row against its checksum) and refuses a damaged file without touching it. A file left by a
   killed writer still carries HDF5's "open for write" flag, which forbids reopening it for writing;
   resume then copies its committed rows into a fresh file (after checking the free disk space) and
   renames that over it.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import h5py
import numpy as np

from ..errors import CacheError, InterpWarning
from . import integrity
from .datasets import append_rows, create_layout
from .format import (ACTS, CHECKSUMS, FORMAT_VERSION, IDS, INDEX, LIBVER, SKIPPED, SKIPPED_FIELDS, acts_path,
                     check_version, committed_skipped, damaged, decode_strings, read_attrs, resume_position, settings_mismatch,
                     weights_hint)

_SPACE_MARGIN = 16 << 20  # free bytes kept beyond a batch or a copy (HDF5 metadata, the filesystem's own)


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


def remove_stale_tmp(path: Path) -> None:
    """Delete ``<name>.tmp-<pid>`` files of ``path`` left by killed writers (call under the writer lock).
    Names are compared exactly (no glob: ``run[1].h5`` must not match ``run1.h5.tmp-7``)."""
    prefix = f"{path.name}.tmp-"
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for entry in entries:
        rest = entry.name[len(prefix):]
        if (entry.name.startswith(prefix) and rest.isdigit() and int(rest) != os.getpid()
                and entry.is_file(follow_symlinks=False)):
            Path(entry.path).unlink(missing_ok=True)


def write_error(path, error: OSError, doing: str) -> CacheError:
    """One line for an OSError while writing ``path`` (read-only folder, disk full...)."""
    reason = integrity.hdf5_reason(error)
    if isinstance(error, PermissionError) or "Permission denied" in reason or "Read-only" in reason:
        fix = "write it into a folder you can write to"
    elif getattr(error, "errno", None) in (28, 27) or "No space" in reason or "too large" in reason:
        fix = "free disk space, then rerun with --resume"
    else:
        fix = "check the folder and the disk, then rerun"
    return CacheError(f"cannot {doing} {str(path)!r} ({reason}): {fix}")


class CacheFile:
    """A cache file open for writing in SWMR mode. Create with :meth:`create` or :meth:`resume`.

    ``path`` is the file being written; ``final`` is where it goes when complete (the same path, except
    while an overwrite is pending: then ``path`` is a temporary file renamed onto ``final`` at the end)."""

    def __init__(self, h5: h5py.File, path: Path, position: int, final: Optional[Path] = None):
        self.h5 = h5
        self.path = path
        self.final = path if final is None else final
        self.meta = read_attrs(h5)
        self.n_written = int(self.meta["n_written"])
        self.position = position  # next input position to process
        self.n_skipped = int(h5[f"{SKIPPED}/index"].shape[0])
        self.hooks: List[str] = list(self.meta["hooks"])
        self.acts = {hook: h5[acts_path(hook)] for hook in self.hooks}
        self.row_shapes = {hook: tuple(ds.shape[1:]) for hook, ds in self.acts.items()}
        self._direct_chunks = self.meta["compression"] == "none"

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, path, meta: dict, shapes: Dict[str, Tuple[int, ...]], replace_at_end: bool = False
               ) -> "CacheFile":
        """A new, empty cache for ``path``. It is built as a temporary file and renamed onto ``path`` once
        it is a valid SWMR file, or (``replace_at_end``: an existing file is being overwritten) only when
        the run completes (:meth:`close`)."""
        path = Path(path)
        tmp = tmp_path(path)
        h5 = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            h5 = h5py.File(tmp, "w", libver=LIBVER)
            create_layout(h5, meta, shapes)
            h5.flush()
            h5.swmr_mode = True
            if not replace_at_end:
                os.replace(tmp, path)
        except BaseException as e:
            raise _discard(h5, tmp, path, e, "create") from None
        return cls(h5, tmp, 0, final=path) if replace_at_end else cls(h5, path, 0)

    @classmethod
    def resume(cls, path, run_meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> "CacheFile":
        """Reopen ``path`` to continue it after its last committed batch.

        Raises:
            CacheError: the file is damaged (left unchanged), not a cache of this version, written with
                other settings (model, hooks, dtype, tokens, norms_only, images), or held by another process.
        """
        path = Path(path)
        old, swmr = integrity.open_read_only(path)
        if swmr:
            # The "open for write" flag of a writer that was killed (a live interp writer would hold the lock),
            # or a file cut short after its last committed row: never modified in place.
            return cls._recover(old, path, run_meta, shapes, "was left open by a writer that stopped without "
                                "closing it" if integrity.superblock(path)[1] else "is shorter than its HDF5 "
                                "superblock records (its writer hit a full disk?)")
        with old:
            cls._check(old, path, run_meta, shapes)
        try:
            h5 = h5py.File(path, "r+", libver=LIBVER)
        except OSError as e:
            if integrity.open_error_kind(e) != "locked":
                raise damaged(path, integrity.hdf5_reason(e)) from None
            # A reader holds HDF5's shared lock: never modify the file under it; continue in a fresh copy.
            return cls._recover(integrity.open_read_only(path)[0], path, run_meta, shapes,
                                "is open for reading in another process")
        try:
            n, position = cls._committed(h5)
            for ds in list(h5[ACTS].values()) + [h5[IDS], h5[INDEX], h5[CHECKSUMS]]:
                ds.resize(n, axis=0)
            n_skipped = committed_skipped(h5, position)
            for name in SKIPPED_FIELDS:
                h5[f"{SKIPPED}/{name}"].resize(n_skipped, axis=0)
            h5.attrs["complete"] = False
            h5.flush()
            h5.swmr_mode = True
        except BaseException as e:
            h5.close()
            if isinstance(e, OSError):
                raise write_error(path, e, "resume") from None
            raise
        return cls(h5, path, position)

    @staticmethod
    def check_before_resume(path) -> None:
        """The checks of a resume that need no model (attributes, structure, index; read-only), so that a damaged
        file is refused before the model loads. A file left open by a stopped writer is left to :meth:`resume`
        (it recovers such a file); the row checksums are read there too, once."""
        old, swmr = integrity.open_read_only(Path(path))
        with old:
            if not swmr:
                CacheFile._check_layout(old, Path(path))

    @staticmethod
    def _check_layout(h5: h5py.File, path: Path) -> Tuple[dict, np.ndarray]:
        """(attributes, committed index) of an open file whose attributes, structure and index are sound."""
        try:
            meta = read_attrs(h5, path)
            check_version(meta, path, versions=(FORMAT_VERSION,))
            integrity.validate_meta(meta, path)
            integrity.check_structure(h5, meta, path)
            index = h5[INDEX][:int(meta["n_written"])]
            integrity.check_index(index, int(meta["n_images"]), path)
        except (*integrity.H5_ERRORS, TypeError, ValueError) as e:
            raise damaged(path, integrity.hdf5_reason(e)) from None
        return meta, index

    @staticmethod
    def _check(h5: h5py.File, path: Path, run_meta: dict, shapes: Dict[str, Tuple[int, ...]]) -> None:
        """Refuse (read-only) a file that is damaged or was written with other settings."""
        meta, index = CacheFile._check_layout(h5, path)
        n = int(meta["n_written"])
        try:
            problems = settings_mismatch(meta, run_meta)
            if not problems:
                for hook in meta["hooks"]:
                    if tuple(h5[acts_path(hook)].shape[1:]) != tuple(shapes[hook]):
                        problems.append(f"{hook}: file rows are {h5[acts_path(hook)].shape[1:]}, "
                                        f"this run's are {shapes[hook]}")
            if problems:
                raise CacheError(
                    f"cannot resume {str(path)!r}: it was written with other settings ({'; '.join(problems)}). "
                    f"{weights_hint(meta, run_meta, problems)}"
                    "Rerun with the settings it was written with, or pass --overwrite (overwrite=True) to start over.")
            ids = decode_strings(h5[IDS][:n])
            integrity.check_ids(path, h5[CHECKSUMS][:n], ids, index)
            integrity.verify_rows(h5, meta, path)
        except (*integrity.H5_ERRORS, TypeError, ValueError) as e:
            raise damaged(path, integrity.hdf5_reason(e)) from None

    @staticmethod
    def _committed(h5: h5py.File) -> Tuple[int, int]:
        """(committed rows, next input position) of an open file."""
        n = int(h5.attrs["n_written"])
        index = h5[INDEX][:n]
        return n, resume_position(index, n, int(h5.attrs["batch_size"]), int(h5.attrs["n_images"]))

    @classmethod
    def _recover(cls, old: h5py.File, path: Path, run_meta: dict, shapes: Dict[str, Tuple[int, ...]], why: str
                 ) -> "CacheFile":
        """Check the committed part of ``path`` (open read-only as ``old``, closed here), copy it into a fresh
        file, rename that over it."""
        tmp, new = tmp_path(path), None
        try:
            with old:
                cls._check(old, path, run_meta, shapes)
                meta = read_attrs(old, path)
                n, position = cls._committed(old)
                n_skipped = committed_skipped(old, position)
                hooks = meta["hooks"]
                needed = sum(int(np.prod(old[acts_path(h)].shape[1:], dtype=np.int64)) * old[acts_path(h)].dtype.itemsize
                             for h in hooks) * n
                integrity.free_space_or_error(path.parent, needed + _SPACE_MARGIN, f"a copy of {n} committed rows",
                                              "the file was left unchanged")
                meta.update(n_written=n, n_skipped=n_skipped, complete=False)
                new = h5py.File(tmp, "w", libver=LIBVER)
                create_layout(new, meta, {h: old[acts_path(h)].shape[1:] for h in hooks})
                for hook in hooks:
                    src, dst = old[acts_path(hook)], new[acts_path(hook)]
                    dst.resize(n, axis=0)
                    step = dst.chunks[0]
                    for i in range(0, n, step):
                        dst[i:min(n, i + step)] = src[i:min(n, i + step)]
                for name in (IDS, INDEX, CHECKSUMS):
                    append_rows(new[name], old[name][:n])
                for name in SKIPPED_FIELDS:
                    append_rows(new[f"{SKIPPED}/{name}"], old[f"{SKIPPED}/{name}"][:n_skipped])
                new.flush()
                new.swmr_mode = True
            os.replace(tmp, path)
        except BaseException as e:
            raise _discard(new, tmp, path, e, "copy the committed rows of") from None
        warnings.warn(f"{str(path)!r} {why}: copied its {n} committed rows into a fresh file; "
                      f"continuing from image {position}.", InterpWarning)
        return cls(new, path, position)

    # ------------------------------------------------------------------ writing
    def append(self, batch: BatchRows) -> None:
        """Store one batch and commit it (rows and checksums first, then the ``n_written`` bump, each flushed).

        A disk without room for the batch is refused before HDF5 writes a byte of it (HDF5 is not safe to
        keep using after a failed write)."""
        if self.path != self.final:  # an overwrite in progress: its rows go with it, the old file stays
            kept = (f"nothing of this run is kept (an unfinished --overwrite is discarded) and the old "
                    f"{str(self.final)!r} is unchanged; free space, then rerun with --overwrite")
        else:
            kept = f"the {self.n_written} rows committed so far are kept; free space, then rerun with --resume"
        integrity.free_space_or_error(self.path.parent, batch.nbytes + _SPACE_MARGIN, "the next batch", kept)
        try:
            self._commit(batch)
        except (OSError, RuntimeError) as e:
            if self.path != self.final:
                raise CacheError(f"cannot write a batch to {str(self.final)!r} ({integrity.hdf5_reason(e)}): "
                                 f"{kept}") from None
            raise write_error(self.final, e, f"write a batch (the {self.n_written} rows committed before it are "
                                             "kept) to") from None

    def _commit(self, batch: BatchRows) -> None:
        b = len(batch.ids)
        if b:
            arrays = {hook: batch.arrays[hook][:b] for hook in self.hooks}
            for hook, ds in self.acts.items():
                self._write_rows(ds, self.n_written, arrays[hook])
            append_rows(self.h5[IDS], batch.ids)
            append_rows(self.h5[INDEX], np.asarray(batch.positions, dtype=np.int64))
            append_rows(self.h5[CHECKSUMS], integrity.batch_checksums(arrays, self.hooks, batch.ids, batch.positions))
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
        """Record ``n_skipped`` (and ``complete`` for a run that processed every image) and close. A pending
        overwrite is renamed onto the old file only when complete; otherwise it is deleted (the old file
        stays). A failure while closing an incomplete run is not raised (the run's own error is)."""
        if not self.h5.id.valid:
            return
        try:
            try:
                self.h5.attrs["n_skipped"] = self.n_skipped
                if complete:
                    self.h5.attrs["complete"] = True
                self.h5.flush()
            finally:
                self.h5.close()
        except (OSError, RuntimeError) as e:  # h5py raises RuntimeError for a flush that cannot extend the file
            if self.path != self.final:
                self.path.unlink(missing_ok=True)
            if complete:
                raise write_error(self.final, e, "finish") from None
            return
        if self.path != self.final:
            if complete:
                os.replace(self.path, self.final)
                self.path = self.final
            else:
                self.path.unlink(missing_ok=True)


def _discard(h5: Optional[h5py.File], tmp: Path, path: Path, error: BaseException, doing: str) -> BaseException:
    """Close a half-written temporary file (ignoring HDF5's complaints), delete it, and return the error to
    raise: one line for an OSError (read-only folder, full disk), else ``error`` itself."""
    if h5 is not None:
        try:
            h5.close()
        except Exception:  # noqa: BLE001 - the file is being thrown away; the caller raises the real error
            pass
    tmp.unlink(missing_ok=True)
    return write_error(path, error, doing) if isinstance(error, (OSError, RuntimeError)) else error
