"""Scale-out under ``torchrun``: each rank caches one contiguous block of the images into its own shard
file, and rank 0 then writes the requested file as HDF5 virtual datasets over the shards.

``out.h5`` -> shards ``out.rank0-of-K.h5`` ... ``out.rank{K-1}-of-K.h5`` next to it; readers open
``out.h5`` and see one file with rows in the original image order. Shard paths inside the virtual
datasets are relative, so the folder can be moved as a whole.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import h5py
import numpy as np
import torch

from ..errors import CacheError
from .format import (ACTS, CHECKSUMS, FORMAT_VERSION, IDS, INDEX, LIBVER, SKIPPED, SKIPPED_FIELDS, acts_path,
                     check_version, decode_strings, read_attrs, write_attrs)
from .integrity import check_ids, check_index, check_structure, id_crcs, open_for_read, validate_meta
from .file_writer import write_file
from .lock import WriterLock
from .image_feed import ImageFeed
from .datasets import ID_CHUNK, append_rows, create_index_datasets
from .store import tmp_path


@dataclass(frozen=True)
class DistContext:
    rank: int
    world: int
    local_rank: int


def detect(required: bool = False) -> Optional[DistContext]:
    """The torchrun rank from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, or None outside torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        if required:
            raise CacheError("distributed=True needs a torchrun launch (WORLD_SIZE > 1 in the environment)")
        return None
    rank = int(os.environ["RANK"])
    return DistContext(rank, world, int(os.environ.get("LOCAL_RANK", rank)))


def block_bounds(n: int, rank: int, world: int) -> Tuple[int, int]:
    """Contiguous block ``[start, stop)`` of ``n`` items for ``rank``; block sizes differ by at most one."""
    return n * rank // world, n * (rank + 1) // world


def shard_path(path: Path, rank: int, world: int) -> Path:
    return path.with_name(f"{path.stem}.rank{rank}-of-{world}{path.suffix}")


def _init_process_group(model) -> bool:
    """Start the default process group unless the caller already did (gloo on CPU, nccl on CUDA)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    on_cuda = next(model.parameters()).is_cuda
    dist.init_process_group("nccl" if on_cuda and dist.is_nccl_available() else "gloo")
    return True


def _all_ranks_ok(ok: bool) -> bool:
    """True on every rank when ``ok`` is True on every rank (a barrier that also carries failures)."""
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def write_sharded(model, source: ImageFeed, hook_names: List[str], path: Path, context: DistContext, *,
                  resume: bool, overwrite: bool, **options):
    """Write this rank's shard, wait for every rank, then (rank 0) the virtual top file ``path``."""
    if path.exists() and not (resume or overwrite):
        raise CacheError(f"{str(path)!r} already exists. Pass --resume (resume=True) to continue it, "
                         "--overwrite (overwrite=True) to replace it, or delete it.")
    started = _init_process_group(model)
    try:
        world, rank = context.world, context.rank
        start, stop = block_bounds(len(source), rank, world)
        shard = {"rank": rank, "world": world, "start": start, "stop": stop, "top": path.name}
        error = summary = None
        try:
            summary = write_file(model, source.subset(start, stop), hook_names, shard_path(path, rank, world),
                                 resume=resume, overwrite=overwrite, shard=shard, **options)
        except Exception as e:  # reported after every rank has had its say
            error = e
        if not _all_ranks_ok(error is None):
            raise error or CacheError(f"another rank failed while caching; its shard of {str(path)!r} is kept. "
                                      "Fix the error it printed and rerun with --resume.")
        if rank == 0:
            try:
                with WriterLock(path):
                    build_virtual_file(path, [shard_path(path, r, world) for r in range(world)], source)
            except Exception as e:
                error = e
        if not _all_ranks_ok(error is None):
            raise error or CacheError(f"rank 0 could not write {str(path)!r} over the shards; rerun with --resume")
        return summary
    finally:
        if started:
            import torch.distributed as dist

            dist.destroy_process_group()


def build_virtual_file(path: Path, shards: List[Path], source: ImageFeed) -> None:
    """Write ``path``: ``/acts/*`` as virtual datasets over the shards' committed rows, in shard order;
    ``/ids``, ``/index`` (positions in the full image list) and ``/skipped`` as real datasets."""
    metas, ids, index, checksums, skipped = [], [], [], [], [[] for _ in SKIPPED_FIELDS]
    for shard in shards:
        with open_for_read(shard) as h5:
            meta = read_attrs(h5, shard)
            check_version(meta, shard, versions=(FORMAT_VERSION,))
            validate_meta(meta, shard)
            check_structure(h5, meta, shard)
            n, start = int(meta["n_written"]), int(meta["shard"]["start"])
            meta["row_shapes"] = {h: h5[acts_path(h)].shape[1:] for h in meta["hooks"]}
            metas.append(meta)
            shard_ids, shard_index, shard_sums = decode_strings(h5[IDS][:n]), h5[INDEX][:n], h5[CHECKSUMS][:n]
            # the merged file re-signs ids and index: verify the shard's own first, or damage would pass as clean
            check_index(shard_index, int(meta["n_images"]), shard)
            check_ids(shard, shard_sums, shard_ids, shard_index)
            ids += shard_ids
            index.append(shard_index + start)
            checksums.append(shard_sums)
            n_skipped = int(meta["n_skipped"])
            skipped[0].append(h5[f"{SKIPPED}/index"][:n_skipped] + start)
            skipped[1] += decode_strings(h5[f"{SKIPPED}/path"][:n_skipped])
            skipped[2] += decode_strings(h5[f"{SKIPPED}/reason"][:n_skipped])
    top = {k: v for k, v in metas[0].items() if k != "row_shapes"}
    top.update(
        n_images=len(source), images_sha256=source.digest(), n_written=len(ids),
        n_skipped=len(skipped[1]), complete=all(m["complete"] for m in metas), shard=None,
        shards=[s.name for s in shards],
    )
    tmp = tmp_path(path)
    try:
        with h5py.File(tmp, "w", libver=LIBVER) as h5:
            for hook in top["hooks"]:
                shape = tuple(metas[0]["row_shapes"][hook])
                layout = h5py.VirtualLayout(shape=(len(ids), *shape), dtype=np.dtype(top["dtype"]))
                offset = 0
                for shard, meta in zip(shards, metas):
                    n = int(meta["n_written"])
                    if n:
                        # Relative name: HDF5 looks for it next to the virtual file.
                        src = h5py.VirtualSource(shard.name, acts_path(hook), shape=(n, *shape))
                        layout[offset:offset + n] = src
                    offset += n
                h5.require_group(ACTS)
                h5.create_virtual_dataset(acts_path(hook), layout, fillvalue=0)
            create_index_datasets(h5)
            append_rows(h5[IDS], ids)
            merged_index = np.concatenate(index).astype(np.int64)
            append_rows(h5[INDEX], merged_index)
            width = len(top["hooks"]) + 1
            sums = np.concatenate(checksums).reshape(-1, width).astype(np.uint32)
            sums[:, -1] = id_crcs(ids, merged_index)  # shard rows record positions relative to their shard
            h5.create_dataset(CHECKSUMS, data=sums, maxshape=(None, width), chunks=(ID_CHUNK, width))
            append_rows(h5[f"{SKIPPED}/index"], np.concatenate(skipped[0]).astype(np.int64))
            append_rows(h5[f"{SKIPPED}/path"], skipped[1])
            append_rows(h5[f"{SKIPPED}/reason"], skipped[2])
            write_attrs(h5, top)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
