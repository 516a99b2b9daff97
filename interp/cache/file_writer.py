"""Write one activation cache file (the whole image set, or one rank's shard under torchrun).

Batch by batch: decode images (prefetch thread), forward with hooks on only the requested hook points
that copy each activation's stored form into a reused buffer (main thread), write and commit the batch
(writer thread, overlapping the next forward).
"""
from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..errors import CacheError
from ..hooks.names import blocks_needed
from .extract import BufferPool, Extractor
from .format import FORMAT_VERSION, model_fingerprints, versions
from .lock import WriterLock
from .pipeline import BackgroundWriter, Prefetcher
from .sources import ImageSource
from .store import BatchRows, CacheFile


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

    def line(self) -> str:
        state = "complete" if self.complete else "INCOMPLETE (rerun with --resume)"
        return (f"interp cache: {self.path}: {self.n_written}/{self.n_images} images written "
                f"({self.new_rows} this run), {self.n_skipped} skipped, {self.mbytes:.1f} MB in "
                f"{self.seconds:.1f} s, {state}")


def write_file(
    model,
    source: ImageSource,
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
) -> WriteSummary:
    """Write one cache file for all images of ``source`` (one shard's under torchrun)."""
    layout = model.layout_for(source.input_size)
    extractor = Extractor(hook_names, layout, tokens, norms_only, dtype)
    shapes = extractor.per_image_shapes(model, source.input_size)
    meta = run_meta(model, source, extractor, compression, batch_size, shard)
    with WriterLock(path):
        if path.exists() and resume:
            store = CacheFile.resume(path, meta, shapes)
            file_batch = int(store.meta["batch_size"])
            if file_batch != batch_size:
                warnings.warn(f"resuming {str(path)!r} with its own batch size {file_batch} (not {batch_size}) "
                              "so batches line up with the interrupted run")
                batch_size = file_batch
        elif path.exists() and not overwrite:
            raise CacheError(f"{str(path)!r} already exists. Pass --resume (resume=True) to continue it, "
                             "--overwrite (overwrite=True) to replace it, or delete it.")
        else:
            store = CacheFile.create(path, meta, shapes)
        return _stream(model, source, extractor, store, batch_size, progress)


def run_meta(model, source: ImageSource, extractor: Extractor, compression: str, batch_size: int,
             shard: Optional[dict] = None) -> dict:
    """The root attributes of a new cache file for this run."""
    from ..models import data_config

    rows = extractor.rows
    return {
        "format_version": FORMAT_VERSION,
        **versions(),
        **model_fingerprints(model),
        "data_config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in data_config(model).items()},
        "input_size": list(source.input_size),
        "layout": extractor.layout.to_dict(),
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


def _stream(model, source: ImageSource, extractor: Extractor, store: CacheFile, batch_size: int,
            progress: bool) -> WriteSummary:
    """Forward every remaining batch and hand it to the writer thread; close the file at the end.

    Kept in one piece on purpose: the order of its steps (fill buffers, submit, commit, mark complete,
    join the writer even on an exception) is what makes a kill at any moment lose nothing committed."""
    from .._progress import tqdm

    n_images = len(source)
    start_rows = store.n_written
    param = next(model.parameters())
    stop_at_layer = blocks_needed(extractor.hooks)
    t0 = time.perf_counter()
    written_bytes = 0
    bar = tqdm(total=n_images, initial=store.position, unit="img", desc=f"cache {store.path.name}",
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

    # At most 3 buffer sets live: one being filled, one queued, one being written.
    pool = BufferPool(store.row_shapes, extractor.np_dtype, batch_size)
    loader = Prefetcher(source, store.position, batch_size)
    writer = BackgroundWriter(commit, depth=1)
    finished = False
    try:
        for loaded in loader:
            for _, _, reason in loaded.skipped:
                warnings.warn(f"skipped unreadable image: {reason}")
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
        path=str(store.path), n_images=n_images, n_written=store.n_written, n_skipped=store.n_skipped,
        new_rows=store.n_written - start_rows, mbytes=written_bytes / 1e6, seconds=time.perf_counter() - t0,
        complete=complete,
    )
    if progress:
        tqdm.write(summary.line(), file=sys.stderr)
    return summary
