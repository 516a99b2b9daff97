"""interp cache under torchrun: 2 gloo processes on CPU, shards + a virtual top file in image order."""
from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import early
import interp.cache
from conftest import REPO, make_model
from interp.cache.distributed import block_bounds, shard_path
from test_cache import write_images
from test_cache_crash import assert_same_cache

HOOKS = ["blocks.*.hook_resid_post", "blocks.1.attn.hook_pattern"]


def test_block_bounds_are_contiguous_and_cover_everything():
    for n in (0, 1, 7, 8, 9):
        for world in (1, 2, 3):
            bounds = [block_bounds(n, r, world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1


@early.launcher("torchrun shards")
def launch_torchrun(workdir: Path) -> early.Launch:
    """torchrun, 2 CPU processes: the test ViT's weights cache 9 images (one unreadable) into 2 shards."""
    with torch.random.fork_rng():  # it runs before the first test: the tests' global RNG stays as it was
        torch.save(make_model("vit").timm_model.state_dict(), workdir / "w.pth")
    folder = write_images(workdir / "imgs", 9, corrupt_at=(2,), size=(24, 24))
    return early.Launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                         "-m", "interp", "cache", "vit_small_patch16_224", "--weights", str(workdir / "w.pth"),
                         "--depth", "2", "--images", str(folder), "--hooks", *HOOKS,
                         "--out", str(workdir / "sharded" / "acts.h5"), "--batch-size", "2", "--no-progress"],
                        env={"OMP_NUM_THREADS": "1"}, cwd=REPO)


@pytest.mark.early("torchrun shards")
def test_torchrun_two_processes_write_shards_and_a_virtual_file(tmp_path):
    run = early.result("torchrun shards")
    assert run.returncode == 0, run.stderr[-3000:]
    model = make_model("vit")
    reference = tmp_path / "reference.h5"
    with pytest.warns(UserWarning, match="img002"):
        interp.cache.write(model, run.workdir / "imgs", hooks=HOOKS, path=reference, batch_size=2, progress=False)

    out = run.workdir / "sharded" / "acts.h5"
    shards = [shard_path(out, r, 2) for r in range(2)]
    assert all(s.is_file() for s in shards)
    with h5py.File(shards[0], "r") as h5:  # rank 0 got images 0-3 (one unreadable), rank 1 images 4-8
        assert h5.attrs["n_written"] == 3 and h5.attrs["n_skipped"] == 1
    with h5py.File(shards[1], "r") as h5:
        assert h5.attrs["n_written"] == 5
    with h5py.File(out, "r") as h5:
        assert all(h5[f"acts/{h}"].is_virtual for h in model.resolve_hooks(HOOKS))
    assert_same_cache(reference, out)

    # The virtual file finds its shards relative to itself: move the folder and read from elsewhere.
    moved = run.workdir / "moved"
    out.parent.rename(moved)
    with interp.cache.open(moved / "acts.h5", model=model) as cache, interp.cache.open(reference) as ref:
        assert cache.complete and cache.ids == ref.ids and cache.index.tolist() == [0, 1, 3, 4, 5, 6, 7, 8]
        assert cache.skipped == ref.skipped and cache.meta["shards"] == [s.name for s in shards]
        for hook in ref.hooks:
            np.testing.assert_array_equal(cache[hook][[7, 0, 3]], ref[hook][[7, 0, 3]])


def test_the_virtual_file_refuses_a_shard_whose_ids_are_damaged(tmp_path):
    """The merged file re-signs ids and index, so each shard's own must verify first (no damage passes as clean)."""
    from interp.cache.distributed import build_virtual_file
    from interp.cache.file_writer import write_file
    from interp.cache.image_feed import TensorImages
    from interp.errors import CacheError

    model = make_model("vit")
    source = TensorImages(torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(0)))
    top = tmp_path / "acts.h5"
    shards = [shard_path(top, r, 2) for r in range(2)]
    for rank, (start, stop) in enumerate([(0, 2), (2, 4)]):
        write_file(model, source.subset(start, stop), ["blocks.1.hook_resid_post"], shards[rank], batch_size=2,
                   dtype="float32", tokens="all", norms_only=False, compression="none", resume=False,
                   overwrite=False, progress=False,
                   shard={"rank": rank, "world": 2, "start": start, "stop": stop, "top": top.name})
    build_virtual_file(top, shards, source)  # intact shards merge
    top.unlink()
    with h5py.File(shards[1], "r+") as h5:
        ids = h5["ids"]
        ids[0] = ids[1]  # a damaged id (same length, valid string)
    with pytest.raises(CacheError, match="damaged|checksum"):
        build_virtual_file(top, shards, source)
    assert not top.exists()
