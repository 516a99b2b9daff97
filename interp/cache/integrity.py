"""Is a cache file whole? Cheap structural checks on open, row checksums, and the damaged-file message.

A cache can be damaged in ways HDF5 alone does not always catch: a file cut short (HDF5 checks the end
of file on a normal open, but not on the SWMR read that opens a killed writer's file), attributes that
are missing or out of range, row datasets shorter than ``n_written``, or flipped bytes in raw data
(HDF5 checksums its metadata, never uncompressed chunk data). Format 2 files therefore store a CRC-32 of
every committed row of every hook and of every row's id and index (``/checksums``). Everything here
raises :class:`CacheError` with one line that names the file, the damage, and what to do.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import h5py
import numpy as np

from ..errors import CacheError
from ..models.layout import TokenLayout
from ..paths import check_input_path
from .format import CHECKSUMS, IDS, INDEX, SKIPPED, SKIPPED_FIELDS, acts_path, damaged, token_rows

# What h5py raises when HDF5 meets damaged metadata: OSError, KeyError (an object that cannot be opened),
# RuntimeError (a chunk index that cannot be read).
H5_ERRORS = (OSError, KeyError, RuntimeError)

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_SWMR_WRITE_FLAG = 0x04  # superblock v3 file-consistency flags: bit 0 write access, bit 2 SWMR write

# Attributes every readable cache has, with the check each value must pass.
_REQUIRED = ("format_version", "model_name", "weights_fingerprint", "layout", "hooks", "dtype", "tokens",
             "batch_size", "n_images", "n_written", "complete")


# ---------------------------------------------------------------------------------------------- the file
def superblock(path) -> Tuple[Optional[int], bool]:
    """(end-of-file address, SWMR-write flag) from an HDF5 file's superblock (versions 2 and 3, what interp
    writes); (None, False) for another superblock version. A file that is not HDF5 is a CacheError."""
    with open(path, "rb") as f:
        head = f.read(48)
    if not head.startswith(_HDF5_SIGNATURE):
        raise CacheError(f"cannot open {str(path)!r}: it is not an HDF5 file (no HDF5 signature at its start); "
                         "give the .h5 file `interp cache` wrote")
    if len(head) < 48 or head[8] not in (2, 3) or head[9] != 8:
        return None, False
    base, _ext, eof = struct.unpack("<QQQ", head[12:36])
    return base + eof, bool(head[11] & _SWMR_WRITE_FLAG)


# HDF5 re-reads metadata whose checksum fails up to 100 times under SWMR, doubling a sleep from 1 ns each
# time: on a file cut short that is minutes per object (Ctrl-C cannot interrupt it). 30 attempts sleep
# about 1 s in all, which still covers a writer's flush in progress.
_SWMR_READ_ATTEMPTS = 30


def _set_read_attempts(fapl, attempts: int) -> bool:
    """``H5Pset_metadata_read_attempts`` through ctypes (h5py does not wrap it); False where the HDF5 library
    h5py loaded cannot be found (then SWMR reads keep HDF5's default)."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "libhdf5" in line and "libhdf5_hl" not in line})
        fn = ctypes.CDLL(libs[0]).H5Pset_metadata_read_attempts
    except (OSError, IndexError, AttributeError):
        return False
    fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
    return fn(fapl.id, attempts) >= 0


def open_swmr_read(path) -> h5py.File:
    """A SWMR-read open whose metadata retries are bounded (see ``_SWMR_READ_ATTEMPTS``). Where they cannot be
    bounded, a file shorter than its superblock is refused first (what makes the retries spin)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_V110)
    if not _set_read_attempts(fapl, _SWMR_READ_ATTEMPTS):
        eof, _ = superblock(path)
        if eof is not None and os.path.getsize(path) < eof:
            raise damaged(path, f"truncated: {os.path.getsize(path)} bytes on disk, its HDF5 superblock records {eof}")
    fid = h5py.h5f.open(os.fsencode(str(path)), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl=fapl)
    return h5py.File(fid)


def open_read_only(path) -> Tuple[h5py.File, bool]:
    """Open a cache file read-only -> (file, opened in SWMR-read mode).

    A file a writer holds, or that a killed writer left (HDF5's 'open for write' flag), is opened in SWMR-read
    mode with bounded retries. So is a file shorter than its superblock says (a copy cut short, a writer
    that hit a full disk after allocating space): it is kept only when every committed row lies inside the
    file and it has checksums (format 2) to verify them; otherwise it is refused as truncated. Anything
    else HDF5 cannot open is refused as damaged (another process's write lock as such)."""
    path = Path(path)
    check_input_path(path, "cache file")
    if not path.is_file():
        raise CacheError(f"cache file {str(path)!r} does not exist")
    eof, _ = superblock(path)
    size = os.path.getsize(path)
    truncated = eof is not None and size < eof
    if not truncated:
        try:
            return h5py.File(path, "r"), False
        except OSError as e:
            kind = open_error_kind(e)
            if kind == "damaged":
                raise damaged(path, hdf5_reason(e)) from None
            if kind == "locked":
                raise CacheError(f"cannot open {str(path)!r}: another process holds it open for writing (HDF5 "
                                 "file lock). Close that program, then retry.") from None
    try:
        h5 = open_swmr_read(path)
    except H5_ERRORS as e:
        raise damaged(path, hdf5_reason(e) if not truncated else
                      f"truncated: {size} bytes on disk, its HDF5 superblock records {eof}") from None
    if truncated:
        try:
            _check_inside(h5, path, size, eof)
        except BaseException:
            h5.close()
            raise
    return h5, True


def _check_inside(h5, path, size: int, eof: int) -> None:
    """A file cut short is usable only if every chunk holding a committed row lies before its end."""
    from .format import read_attrs

    why = f"truncated: {size} bytes on disk, its HDF5 superblock records {eof}"
    try:
        meta = read_attrs(h5, path)
        if int(meta.get("format_version", 0)) < 2:
            raise damaged(path, why)
        validate_meta(meta, path)
        check_structure(h5, meta, path)
        n = int(meta["n_written"])
        for name in [acts_path(h) for h in meta["hooks"]] + [IDS, INDEX, CHECKSUMS]:
            ds = h5[name]
            if ds.is_virtual or ds.chunks is None:
                continue
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                if info.chunk_offset[0] < n and info.byte_offset + info.size > size:
                    raise damaged(path, f"{why}; rows from {info.chunk_offset[0]} of /{name} lie past its end")
    except (*H5_ERRORS, TypeError, ValueError) as e:
        raise damaged(path, f"{why}; {hdf5_reason(e)}") from None


def open_for_read(path) -> h5py.File:
    """:func:`open_read_only` without the mode."""
    return open_read_only(path)[0]


def hdf5_reason(error: BaseException) -> str:
    """HDF5's own words from an h5py error, on one line: the system's error message when HDF5 quotes one
    ("File too large"), else the text in h5py's parentheses ('truncated file: eof = ...')."""
    text = " ".join(str(error).split())
    quoted = re.search(r"error message = '([^']*)'", text)
    if quoted:
        errno = re.search(r"errno = (\d+)", text)
        return quoted.group(1) + (f" (errno {errno.group(1)})" if errno else "")
    start = text.find("(")
    return text[start + 1:text.rfind(")")] if start >= 0 and text.endswith(")") else text


def open_error_kind(error: OSError) -> str:
    """What a failed HDF5 open means: ``locked`` (another process holds HDF5's file lock), ``open_for_write``
    (the SWMR/'open for write' flag of a running or killed writer), or ``damaged`` (anything else)."""
    text = str(error)
    if "already open for write" in text:
        return "open_for_write"
    if isinstance(error, BlockingIOError) or "unable to lock file" in text:
        return "locked"
    return "damaged"


# ---------------------------------------------------------------------------------------------- attributes
def validate_meta(meta: dict, path) -> None:
    """Refuse attributes that are missing or out of range (after the version check)."""
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise damaged(path, f"attribute {missing[0]!r} is missing")

    def integer(key: str, low: int) -> int:
        value = meta[key]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
            raise damaged(path, f"attribute {key!r} is {value!r}, expected an integer >= {low}")
        return int(value)

    n_images, n_written = integer("n_images", 0), integer("n_written", 0)
    integer("batch_size", 1)
    if n_written > n_images:
        raise damaged(path, f"n_written {n_written} exceeds n_images {n_images}")
    hooks = meta["hooks"]
    if not isinstance(hooks, list) or not hooks or not all(isinstance(h, str) for h in hooks):
        raise damaged(path, f"attribute 'hooks' is {hooks!r}, expected a list of hook names")
    if not isinstance(meta["layout"], dict):
        raise damaged(path, f"attribute 'layout' is {meta['layout']!r}, expected a token layout")
    if meta["dtype"] not in ("float16", "float32"):
        raise damaged(path, f"attribute 'dtype' is {meta['dtype']!r}")
    if "model_depth" in meta and meta["model_depth"] is not None:
        integer("model_depth", 1)
    blocks = meta.get("blocks")
    if blocks is not None and (not isinstance(blocks, list) or not all(isinstance(b, str) for b in blocks)
                               or len(blocks) != meta.get("model_depth", len(blocks))):
        raise damaged(path, f"attribute 'blocks' is {str(blocks)[:80]!r}, expected the model's block names, one "
                            "per block")
    if meta.get("token_rows") is not None:
        _check_token_rows(meta, path)


def _check_token_rows(meta: dict, path) -> None:
    """``token_rows`` is the [start, stop) its layout and ``tokens`` mode give (an edited one would say
    "complete" and then hand the studies zero tokens)."""
    try:
        rows = token_rows(TokenLayout.from_dict(meta["layout"]), meta["tokens"])
    except (KeyError, TypeError, ValueError, CacheError) as e:
        raise damaged(path, f"attributes 'layout'/'tokens' do not describe a token layout ({e})") from None
    if list(meta["token_rows"]) != [rows.start, rows.stop]:
        raise damaged(path, f"attribute 'token_rows' is {meta['token_rows']!r}, but its layout and "
                            f"tokens={meta['tokens']!r} give [{rows.start}, {rows.stop}]")


# ---------------------------------------------------------------------------------------------- structure
def check_structure(h5, meta: dict, path) -> None:
    """Every dataset the attributes promise exists and holds at least ``n_written`` rows."""
    n = int(meta["n_written"])
    needed = [(acts_path(h), f"hook {h}") for h in meta["hooks"]] + [(IDS, "/ids"), (INDEX, "/index")]
    if int(meta["format_version"]) >= 2:
        needed.append((CHECKSUMS, "/checksums"))
    for name in SKIPPED_FIELDS:  # any length: the skipped images are not rows
        if f"{SKIPPED}/{name}" not in h5:
            raise damaged(path, f"/{SKIPPED}/{name} (the list of skipped images) is missing")
    for name, what in needed:
        if name not in h5:
            raise damaged(path, f"{what} is missing")
        rows = h5[name].shape[0] if h5[name].shape else 0
        if rows < n:
            raise damaged(path, f"{what} has {rows} rows but the file records {n} written")


def check_index(index: np.ndarray, n_images: int, path) -> None:
    """Row positions increase strictly and lie in ``[0, n_images)``."""
    if index.size and (index[0] < 0 or index[-1] >= n_images or np.any(np.diff(index) <= 0)):
        raise damaged(path, f"/index is not an increasing list of positions below {n_images}")


# ---------------------------------------------------------------------------------------------- checksums
def row_crcs(values: np.ndarray) -> np.ndarray:
    """CRC-32 of each row of ``values`` [b, ...] (the bytes as stored, C order) -> uint32 [b]."""
    values = np.ascontiguousarray(values)
    if len(values) == 0:
        return np.zeros(0, np.uint32)
    return np.fromiter((zlib.crc32(row) for row in values.reshape(len(values), -1)), np.uint32, len(values))


def id_crcs(ids: Sequence[str], positions: Sequence[int]) -> np.ndarray:
    return np.fromiter((zlib.crc32(f"{int(p)}\0{i}".encode("utf-8")) for i, p in zip(ids, positions)),
                       np.uint32, len(ids))


def batch_checksums(arrays: Dict[str, np.ndarray], hooks: List[str], ids, positions) -> np.ndarray:
    """The ``/checksums`` rows of one batch: uint32 [b, len(hooks) + 1]."""
    columns = [row_crcs(arrays[h]) for h in hooks] + [id_crcs(ids, positions)]
    return np.stack(columns, axis=1)


def first_bad_row(stored: np.ndarray, values: np.ndarray) -> Optional[int]:
    """Index of the first row of ``values`` whose CRC differs from ``stored`` [b] (None: all match)."""
    bad = np.flatnonzero(row_crcs(values) != stored)
    return int(bad[0]) if bad.size else None


def check_rows(path, what: str, start: int, stored: np.ndarray, values: np.ndarray) -> None:
    bad = first_bad_row(stored, values)
    if bad is not None:
        raise damaged(path, f"row {start + bad} of {what} does not match its checksum")


def check_ids(path, checksums: np.ndarray, ids: Sequence[str], index: np.ndarray) -> None:
    bad = np.flatnonzero(id_crcs(ids, index) != checksums[:, -1])
    if bad.size:
        raise damaged(path, f"the id or index of row {int(bad[0])} does not match its checksum")


def verify_rows(h5, meta: dict, path) -> None:
    """Read every committed row of every hook and compare it with ``/checksums`` (format 2 files), one stored
    chunk at a time (each chunk is decompressed once)."""
    n = int(meta["n_written"])
    sums = h5[CHECKSUMS][:n]
    for j, hook in enumerate(meta["hooks"]):
        ds = h5[acts_path(hook)]
        step = ds.chunks[0] if ds.chunks else 64
        for i in range(0, n, step):
            check_rows(path, hook, i, sums[i:i + step, j], ds[i:min(n, i + step)])


def free_bytes(folder: Path) -> int:
    """Free bytes on the filesystem holding ``folder`` (for this user)."""
    return shutil.disk_usage(folder).free


def free_space_or_error(folder: Path, needed: int, what: str, then: str) -> None:
    """Refuse to start writing ``needed`` bytes into ``folder`` when the disk has less free; ``then`` says
    what state the cache is left in."""
    free = free_bytes(folder)
    if free < needed:
        raise CacheError(f"not enough free disk space in {str(folder)!r} for {what}: about {needed / 1e6:.1f} MB "
                         f"needed, {free / 1e6:.1f} MB free; {then}")
