"""``interp.cache.open``: lazy, read-only access to a cache file.

>>> summary = interp.cache.write(model, photos, hooks="blocks.0.hook_resid_post", path="acts.h5", progress=False)
>>> with interp.cache.open("acts.h5") as cache:
...     names = cache.hooks                           # ['blocks.0.hook_resid_post']
...     x = cache["blocks.0.hook_resid_post"][1:3]    # ndarray [2, T, D]; reads only those rows
...     for rows, x in cache.batches("blocks.0.hook_resid_post", batch_size=2):
...         pass                                      # rows: ndarray of row numbers, x: ndarray
...     acts = cache.activation_cache([0, 2, 3])      # {hook: Tensor[3, ...]}, like run_with_cache
>>> names, acts["blocks.0.hook_resid_post"].shape
(['blocks.0.hook_resid_post'], torch.Size([3, 197, 192]))
"""
from __future__ import annotations

import fnmatch
import warnings
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import CacheError, HookNameError, InterpWarning, close_matches
from ..hooks import names as hook_names_mod
from ..models.layout import TokenLayout
from . import integrity
from .format import (CHECKSUMS, IDS, INDEX, SKIPPED, acts_path, check_version, committed_skipped, damaged,
                     decode_strings, model_fingerprints, read_attrs, resume_position, weights_advice)

RowKey = Union[int, slice, Sequence[int], np.ndarray]


def _row_numbers(key, n: int) -> np.ndarray:
    """Row numbers (in order, repeats kept) that a row key selects among ``n`` rows."""
    if isinstance(key, (int, np.integer)):
        return np.array([int(key) + (n if key < 0 else 0)])
    if isinstance(key, slice):
        return np.arange(*key.indices(n))
    idx = np.asarray(key)
    if idx.dtype == bool:
        return np.flatnonzero(idx)
    idx = idx.astype(np.int64).reshape(-1)
    return np.where(idx < 0, idx + n, idx)


def _read_rows(ds, n: int, key) -> np.ndarray:
    """Rows ``key`` (int, slice, int array or bool mask, optionally a tuple with more axes) of the first
    ``n`` rows of an h5py dataset, in the order asked for."""
    rest: Tuple = ()
    if isinstance(key, tuple):
        key, rest = key[0], key[1:]
    if isinstance(key, (int, np.integer)):
        i = int(key) + (n if key < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"row {key} out of range for {n} rows")
        return ds[(i, *rest)]
    if isinstance(key, slice):
        start, stop, step = key.indices(n)
        if step == 1:
            return ds[(slice(start, max(start, stop)), *rest)]
        idx = np.arange(start, stop, step)
    else:
        idx = np.asarray(key)
        if idx.dtype == bool:
            if idx.shape != (n,):
                raise IndexError(f"boolean row mask must have shape ({n},), got {idx.shape}")
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64).reshape(-1)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"row indices out of range for {n} rows")
    if idx.size == 0:
        return ds[(slice(0, 0), *rest)]
    rows, inverse = np.unique(idx, return_inverse=True)
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if hi - lo <= 2 * rows.size:  # dense enough: one contiguous read is cheaper than point selections
        data = ds[(slice(lo, hi), *rest)][rows - lo]
    else:
        data = ds[(rows, *rest)]
    return data[inverse.reshape(-1)]


class HookView:
    """The stored activations of one hook, read lazily: ``view[i:j]`` -> ndarray [j - i, ...].

    Only the file's committed rows exist (``len(view)``); ``view.shape``/``view.dtype`` describe them.
    In a format-2 file, every read of whole rows is checked against the rows' checksums (a mismatch is a
    :class:`CacheError` naming the row); a read of part of each row (``view[i:j, :5]``) is not.
    """

    def __init__(self, dataset, n_rows: int, hook: str, checksums=None, path=None):
        self.dataset = dataset
        self.hook = hook
        self._n = n_rows
        self._checksums = checksums  # callable -> uint32 [n_rows] for this hook, or None (format 1)
        self._path = path if path is not None else dataset.file.filename

    @property
    def shape(self) -> Tuple[int, ...]:
        return (self._n, *self.dataset.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.dataset.dtype

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, key) -> np.ndarray:
        try:
            values = _read_rows(self.dataset, self._n, key)
        except integrity.H5_ERRORS as e:  # HDF5 found damaged metadata (a chunk index, a checksum) while reading
            raise damaged(self._path, f"reading {self.hook}: {integrity.hdf5_reason(e)}") from None
        if self._checksums is not None and not isinstance(key, tuple):
            rows = _row_numbers(key, self._n)
            stored = self._checksums()[rows]
            bad = integrity.first_bad_row(stored, values.reshape(len(rows), *self.dataset.shape[1:]))
            if bad is not None:
                raise damaged(self._path, f"row {int(rows[bad])} of {self.hook} does not match its checksum")
        return values

    def __repr__(self) -> str:
        return f"HookView({self.hook!r}, shape={self.shape}, dtype={self.dtype})"


class CacheReader:
    """An open cache file. Create with :func:`open`; close with ``close()`` or a ``with`` block.

    Attributes:
        path: the file.
        meta: every root attribute (JSON ones decoded): model, fingerprints, data_config, layout, ...
        hooks: stored hook names, in model order.
        ids: image id (path) of each row.
        index: position of each row's image in the list the cache was written from (ndarray [N]).
        layout: the model's token layout for the cached input size.
        skipped: ``(position, path, reason)`` of each image that could not be read.
        complete: False for a file whose writer did not finish (only its committed rows are exposed).
        model_depth: number of blocks of the model that wrote the file (see :attr:`model_depth`).

    Opening checks the file's structure (attributes, dataset lengths, ``/index``; ids against their
    checksums in format 2) and refuses a damaged file with a :class:`CacheError`; :meth:`verify` also reads
    every row and compares it with its checksum.
    """

    def __init__(self, path: Union[str, Path], model=None):
        self.path = Path(path)
        self._h5, live = integrity.open_read_only(self.path)
        self._checksum_columns: Dict[str, np.ndarray] = {}
        try:
            self.meta = read_attrs(self._h5, self.path)
            if live:
                # HDF5 fixes a SWMR reader's end of allocation when it opens the file, but reads attributes as
                # they are now: rows a running writer committed since then can lie past that end. Reopening
                # after reading the attributes puts every row they count inside the handle's view.
                self._h5.close()
                self._h5, _ = integrity.open_read_only(self.path)
            check_version(self.meta, self.path)
            integrity.validate_meta(self.meta, self.path)
            if model is not None:
                check_model(self.meta, model, self.path)
            self._n = int(self.meta["n_written"])
            self.hooks: List[str] = list(self.meta["hooks"])
            self.complete = bool(self.meta["complete"])
            try:
                self.layout = TokenLayout.from_dict(self.meta["layout"])
                integrity.check_structure(self._h5, self.meta, self.path)
                self.ids: List[str] = decode_strings(self._h5[IDS][:self._n])
                self.index: np.ndarray = self._h5[INDEX][:self._n]
                integrity.check_index(self.index, int(self.meta["n_images"]), self.path)
                if self._has_checksums:
                    integrity.check_ids(self.path, self._h5[CHECKSUMS][:self._n], self.ids, self.index)
                self.skipped = self._read_skipped()
            except (*integrity.H5_ERRORS, TypeError, ValueError) as e:
                raise damaged(self.path, integrity.hdf5_reason(e)) from None
        except BaseException:
            self._h5.close()
            raise
        if not self.complete:
            warnings.warn(
                f"{str(self.path)!r} is an incomplete cache (its writer did not finish): exposing its "
                f"{self._n} committed rows of {self.meta['n_images']} images. Finish it with "
                "`interp cache ... --resume` (write(..., resume=True)).", InterpWarning, stacklevel=3)

    def _read_skipped(self) -> List[Tuple[int, str, str]]:
        n = int(self._h5[f"{SKIPPED}/index"].shape[0])
        if not self.complete and not self.meta.get("shards"):
            position = resume_position(self.index, self._n, int(self.meta["batch_size"]), int(self.meta["n_images"]))
            n = committed_skipped(self._h5, position)
        index = self._h5[f"{SKIPPED}/index"][:n]
        paths = decode_strings(self._h5[f"{SKIPPED}/path"][:n])
        reasons = decode_strings(self._h5[f"{SKIPPED}/reason"][:n])
        return [(int(i), p, r) for i, p, r in zip(index, paths, reasons)]

    @property
    def _has_checksums(self) -> bool:
        return int(self.meta["format_version"]) >= 2

    def _checksums_of(self, hook: str) -> np.ndarray:
        """uint32 [n] CRC-32 of each committed row of ``hook`` (read once)."""
        if hook not in self._checksum_columns:
            self._checksum_columns[hook] = self._h5[CHECKSUMS][:self._n, self.hooks.index(hook)]
        return self._checksum_columns[hook]

    @property
    def model_depth(self) -> int:
        """Number of blocks of the model that wrote the cache (so block -1 means its last block, as live).

        Format-2 files record it (``model_depth`` attribute). Format-1 files do not; for them this is the
        number of blocks up to the deepest cached ``blocks.{i}`` hook (``i + 1``): a lower bound, equal to
        the depth whenever the last block was cached; 0 when no block hook was cached."""
        depth = self.meta.get("model_depth")
        if depth is not None:
            return int(depth)
        blocks = [hook_names_mod.block_of(h) for h in self.hooks]
        return max((b + 1 for b in blocks if b is not None), default=0)

    @property
    def blocks(self) -> hook_names_mod.BlockNames:
        """The hook-name prefix of every block of the model that wrote the cache (``blocks`` attribute; files
        written before it was recorded: ``blocks.0 .. blocks.{model_depth - 1}``)."""
        prefixes = self.meta.get("blocks")
        if prefixes:
            return hook_names_mod.BlockNames(tuple(str(p) for p in prefixes))
        return hook_names_mod.BlockNames.flat(self.model_depth)

    def verify(self) -> None:
        """Read every committed row and compare it with its checksum; raise :class:`CacheError` naming the
        first damaged row. Format-1 files have no checksums: their structure is checked on open only."""
        if self._has_checksums:
            try:
                integrity.verify_rows(self._h5, self.meta, self.path)
            except integrity.H5_ERRORS as e:
                raise damaged(self.path, integrity.hdf5_reason(e)) from None

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return self._n

    def __contains__(self, hook: str) -> bool:
        return hook in self.hooks

    def __getitem__(self, hook: str) -> HookView:
        if hook not in self.hooks:
            raise self._missing(hook)
        checksums = (lambda: self._checksums_of(hook)) if self._has_checksums else None
        return HookView(self._h5[acts_path(hook)], self._n, hook, checksums, self.path)

    def _missing(self, name: str) -> CacheError:
        hints = close_matches(name, self.hooks)
        hint = f" Close matches: {', '.join(hints)}." if hints else ""
        return CacheError(f"{name!r} is not in {str(self.path)!r}.{hint} It holds: {', '.join(self.hooks)}.")

    def _resolve(self, spec) -> List[str]:
        """Stored hook names selected by a name, glob pattern, list of those, or callable."""
        try:
            return hook_names_mod.resolve(spec, self.hooks)
        except HookNameError:
            missing = [s for s in ([spec] if isinstance(spec, str) else spec) if not any(
                n == s or hook_names_mod.is_pattern(s) and fnmatch.fnmatchcase(n, s) for n in self.hooks)]
            raise self._missing(missing[0] if missing else str(spec)) from None

    def get(self, hook: str, start: int = 0, stop: Optional[int] = None, torch: bool = False):
        """Rows ``[start, stop)`` of ``hook`` as an ndarray (or a CPU Tensor with ``torch=True``)."""
        values = self[hook][start:stop]
        return _to_torch(values) if torch else values

    def read(self, hook: str, rows: RowKey, torch: bool = False):
        """Arbitrary rows (any order, repeats allowed) of ``hook`` as an ndarray or Tensor."""
        values = self[hook][rows]
        return _to_torch(values) if torch else values

    def batches(self, hooks, batch_size: int = 256, start: int = 0, stop: Optional[int] = None,
                torch: bool = False) -> Iterator[Tuple[np.ndarray, object]]:
        """Consecutive row batches, reading one batch at a time.

        Args:
            hooks: one hook name (values are arrays) or a list/glob pattern (values are {hook: array}).
            batch_size: rows per batch.
            start, stop: row range (default: every row).
            torch: yield CPU Tensors instead of ndarrays.

        Yields:
            (rows, values): rows is ndarray[b] of row numbers (``reader.ids``/``reader.index`` map them to
            images); values is ndarray[b, ...] or {hook: ndarray[b, ...]}.
        """
        single = isinstance(hooks, str) and not hook_names_mod.is_pattern(hooks)
        names = [hooks] if single else self._resolve(hooks)
        views = [self[h] for h in names]
        stop = self._n if stop is None else min(stop, self._n)
        for i in range(start, stop, batch_size):
            j = min(stop, i + batch_size)
            values = {h: v[i:j] for h, v in zip(names, views)}
            if torch:
                values = {h: _to_torch(v) for h, v in values.items()}
            yield np.arange(i, j), (values[names[0]] if single else values)

    def activation_cache(self, rows: RowKey, hooks=None) -> Dict[str, torch.Tensor]:
        """{hook: Tensor[len(rows), ...]} for the given rows, shaped like ``run_with_cache``'s cache
        (restricted to the stored token rows / norms)."""
        names = self.hooks if hooks is None else self._resolve(hooks)
        if isinstance(rows, (int, np.integer)):
            rows = [rows]
        from ..hooks.activations import ActivationDict

        return ActivationDict({h: _to_torch(self[h][rows]) for h in names}, hook_names=self.hooks)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self._h5.id.valid:
            self._h5.close()

    def __enter__(self) -> "CacheReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        flags = (", norms" if self.meta["norms_only"] else "") + ("" if self.complete else ", INCOMPLETE")
        return (f"CacheReader({str(self.path)!r}: {self._n} images, {len(self.hooks)} hooks, {self.meta['model_name']}, "
                f"{self.meta['dtype']}, tokens={self.meta['tokens']}{flags})")


def _to_torch(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values))


def check_model(meta: dict, model, path) -> None:
    """Raise :class:`CacheError` unless ``model`` has the weights the cache was written with: one line saying
    what differs, how to load the cache's weights again (the seed alone when only the random-weights seed
    differs), and the command that writes a cache for this model."""
    fp = model_fingerprints(model)
    if fp["weights_fingerprint"] == meta.get("weights_fingerprint"):
        return
    same_arch = fp["architecture_fingerprint"] == meta.get("architecture_fingerprint")
    src = meta.get("weights_source") if isinstance(meta.get("weights_source"), dict) else {}
    file_seed, run_seed = src.get("seed"), getattr(model, "init_seed", None)
    if same_arch and src.get("pretrained") is False and None not in (file_seed, run_seed) and file_seed != run_seed:
        advice = (f"Both are random weights that differ only by their seed: the cache was written with --seed "
                  f"{file_seed}, this model was built with --seed {run_seed}; rerun with --no-pretrained --seed "
                  f"{file_seed} (interp.load({fp['model_name']!r}, pretrained=False, seed={file_seed})). ")
    else:
        advice = weights_advice(meta)
    raise CacheError(
        f"{str(path)!r} was written by model {meta.get('model_name')!r} (weights {meta.get('weights_fingerprint')}, "
        f"architecture {meta.get('architecture_fingerprint')}), but this model is {fp['model_name']!r} "
        f"(weights {fp['weights_fingerprint']}, architecture {fp['architecture_fingerprint']}): "
        f"{'the weights differ' if same_arch else 'the architecture differs'}. {advice}Use the model that wrote "
        f"it, or write a cache for this one: `interp cache {fp['model_name']} --images DIR --for STUDY --out NEW.h5` "
        "(in Python: interp.cache.open(path) without model= skips this check)."
    )


def open(path: Union[str, Path], model=None) -> CacheReader:  # noqa: A001 - mirrors builtins.open on purpose
    """Open a cache file for reading.

    Args:
        path: the ``.h5`` file ``interp cache`` / ``interp.cache.write`` wrote (or its virtual top file).
        model: optional HookedViT; a cache written by another model (weights fingerprint) is an error.

    Raises:
        CacheError: missing or non-cache file, another format version, or another model.
    """
    return CacheReader(path, model=model)
