"""Write one activation cache file (the whole image set, or one rank's shard under torchrun).

Batch by batch: decode images (prefetch thread), forward with hooks on only the requested hook points
that copy each activation's stored form into a reused buffer (main thread), write and commit the batch
(writer thread, overlapping the next forward).
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..errors import CacheError, InterpWarning
from .extract import BufferPool, Extractor
from .format import FORMAT_VERSION, model_fingerprints, versions
from .format import weights_source as format_weights_source
from .lock import WriterLock
from .pipeline import BackgroundWriter, Prefetcher
from .image_feed import ImageFeed
from .store import BatchRows, CacheFile, remove_stale_tmp, write_error


@dataclass
class WriteSummary:
    """What a cache run did. ``mbytes``/``seconds`` count this run only (not rows kept from a resumed file)."""

    path: str
    n_images: int
    n_written: int
    n_skipped: int
    new_rows: int
    mbytes: float
    seconds: float
    complete: bool
    file_mbytes: float = 0.0  # size of the file on disk at the end (MB)

    def line(self) -> str:
        state = "complete" if self.complete else "INCOMPLETE (rerun with --resume)"
        return (f"interp cache: {self.path}: {self.n_written}/{self.n_images} images written "
                f"({self.new_rows} this run), {self.n_skipped} skipped, {self.mbytes:.1f} MB of activations "
                f"in {self.seconds:.1f} s, file {self.file_mbytes:.1f} MB, {state}")


def write_file(
    model,
    source: ImageFeed,
    hook_names,
    path: Path,
    *,
    batch_size: int,
    dtype: str,
    tokens: str,
    norms_only: bool,
    compression: str,
    resume: bool,
    overwrite: bool,
    progress: bool,
    shard: Optional[dict] = None,
    weights_source: Optional[dict] = None,
) -> WriteSummary:
    """Write one cache file for all images of ``source`` (one shard's under torchrun).

    The lock, the file and its temporary files live at the resolved path (``os.path.realpath``), so two
    runs through different symlinks to one file exclude each other; messages name ``path`` as given."""
    if path.is_dir():
        raise CacheError(f"{str(path)!r} is a folder; give the path of the .h5 file to write")
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():  # a device node, FIFO or socket (or a link to one): not a cache
        raise CacheError(f"{str(path)!r} is {'a link to ' if os.path.islink(path) else ''}a device, FIFO or socket "
                         f"({str(target)!r}), not a regular file; interp never writes over it: choose another path")
    layout = model.layout_for(source.input_size)
    extractor = Extractor(hook_names, layout, model.block_names, tokens, norms_only, dtype)
    shapes = extractor.per_image_shapes(model, source.input_size)
    meta = run_meta(model, source, extractor, compression, batch_size, shard, weights_source)
    lock = WriterLock(target)
    try:
        lock.acquire()
    except OSError as e:
        raise write_error(path, e, "write") from None
    try:
        remove_stale_tmp(target)
        if target.exists() and resume:
            store = CacheFile.resume(target, meta, shapes)
            file_batch = int(store.meta["batch_size"])
            if file_batch != batch_size:
                warnings.warn(f"resuming {str(path)!r} with its own batch size {file_batch} (not {batch_size}) "
                              "so batches line up with the interrupted run", InterpWarning)
                batch_size = file_batch
        elif target.exists() and not overwrite:
            raise CacheError(f"{str(path)!r} already exists. Pass --resume (resume=True) to continue it, "
                             "--overwrite (overwrite=True) to replace it, or delete it.")
        else:
            # Overwriting: the old file stays until the new run is complete.
            store = CacheFile.create(target, meta, shapes, replace_at_end=target.exists())
        return _stream(model, source, extractor, store, batch_size, progress, str(path))
    finally:
        lock.release()


def run_meta(model, source: ImageFeed, extractor: Extractor, compression: str, batch_size: int,
             shard: Optional[dict] = None, weights_source: Optional[dict] = None) -> dict:
    """The root attributes of a new cache file for this run (``weights_source``: see
    :func:`.format.weights_source`; unknown fields when None)."""
    from ..models import data_config

    rows = extractor.rows
    return {
        "format_version": FORMAT_VERSION,
        **versions(),
        **model_fingerprints(model),
        "model_depth": int(model.n_layers),
        "weights_source": weights_source or _weights_source_of(model),
        "data_config": {k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in (source.data_config or data_config(model)).items()},
        "input_size": list(source.input_size),
        "layout": extractor.layout.to_dict(),
        "blocks": list(model.block_names.prefixes),
        "hooks": list(extractor.hooks),
        "dtype": extractor.dtype,
        "tokens": extractor.tokens,
        "token_rows": [rows.start, rows.stop],
        "norms_only": bool(extractor.norms_only),
        "compression": compression,
        "batch_size": int(batch_size),
        "n_images": len(source),
        "images_sha256": source.digest(),
        "n_written": 0,
        "n_skipped": 0,
        "complete": False,
        "shard": shard,
        "shards": [],
    }


def _weights_source_of(model) -> dict:
    """What the model itself tells of its weights: the seed of random weights (``interp.load(...,
    pretrained=False)`` keeps it as ``init_seed``); hub or file weights are not told apart here."""
    seed = getattr(model, "init_seed", None)
    return format_weights_source(pretrained=False if seed is not None else None, seed=seed)


def _stream(model, source: ImageFeed, extractor: Extractor, store: CacheFile, batch_size: int,
            progress: bool, shown_path: str) -> WriteSummary:
    """Forward every remaining batch and hand it to the writer thread; close the file at the end.

    Kept in one piece on purpose: the order of its steps (fill buffers, submit, commit, mark complete,
    join the writer even on an exception) is what makes a kill at any moment lose nothing committed."""
    from .._progress import tqdm

    n_images = len(source)
    start_rows = store.n_written
    param = next(model.parameters())
    stop_at_layer = model.block_names.blocks_needed(extractor.hooks)
    t0 = time.perf_counter()
    written_bytes = 0
    bar = tqdm(total=n_images, initial=store.position, unit="img", desc=f"cache {store.final.name}",
               disable=not progress, dynamic_ncols=True, file=sys.stderr)

    def commit(item) -> None:
        nonlocal written_bytes
        rows, buffers = item
        consumed = rows.stop - store.position
        store.append(rows)
        if buffers is not None:
            pool.release(buffers)
        written_bytes += rows.nbytes
        bar.update(consumed)
        bar.set_postfix_str(f"{written_bytes / 1e6 / max(time.perf_counter() - t0, 1e-9):.1f} MB/s")

    # At most 3 buffer sets live: one being filled, one queued, one being written. A batch never holds
    # more images than remain (--batch-size 100000 on 24 images allocates 24 rows).
    pool = BufferPool(store.row_shapes, extractor.np_dtype, max(1, min(batch_size, n_images - store.position)))
    loader = Prefetcher(source, store.position, batch_size)
    writer = BackgroundWriter(commit, depth=1)
    finished = False
    try:
        for loaded in loader:
            for _, _, reason in loaded.skipped:
                warnings.warn(f"skipped unreadable image: {reason}", InterpWarning)
            rows, buffers = BatchRows({}, [], [], loaded.skipped, loaded.stop), None
            if loaded.pixels is not None:
                x = loaded.pixels.to(device=param.device, dtype=param.dtype)
                buffers = pool.acquire()
                rows.arrays = {h: a[:len(x)] for h, a in buffers.items()}
                # The hooks copy each activation's stored form into the buffers as it fires (run_with_cache's
                # values, without keeping every float32 activation of the batch alive).
                fired = set()
                with torch.inference_mode():
                    model.run_with_hooks(x, fwd_hooks=extractor.copy_hooks(rows.arrays, fired),
                                         stop_at_layer=stop_at_layer)
                extractor.check_fired(fired)
                rows.ids = [source.ids[p] for p in loaded.positions]
                rows.positions = loaded.positions
            writer.submit((rows, buffers))
        writer.finish()
        finished = True
    finally:
        loader.stop()
        if not finished:
            writer.finish(raise_errors=False)  # keep the batches already computed
        complete = finished and store.position >= n_images
        store.close(complete=complete)
        bar.close()
    summary = WriteSummary(
        path=shown_path, n_images=n_images, n_written=store.n_written, n_skipped=store.n_skipped,
        new_rows=store.n_written - start_rows, mbytes=written_bytes / 1e6, seconds=time.perf_counter() - t0,
        complete=complete, file_mbytes=os.path.getsize(store.final) / 1e6,
    )
    if progress:
        tqdm.write(summary.line(), file=sys.stderr)
    return summary
