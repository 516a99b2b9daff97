"""Crash safety of interp.cache: ``kill -9`` a writer at random moments, resume, and get the same file."""
from __future__ import annotations

import math
import random
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import interp.cache
from conftest import make_model
from forked import Forked
from forked import cli as forked_cli
from interp.errors import CacheError
from test_cache import write_images

HOOKS = ["blocks.*.hook_resid_post", "blocks.0.attn.hook_pattern"]
N_IMAGES = 60
CORRUPT_AT = (7, 8, 41, 59)  # includes a whole batch-size-1 run of skips and the very last image


def committed_rows(path: Path) -> int:
    """n_written of a file another process may be writing (-1 while there is no readable file)."""
    try:
        with h5py.File(path, "r", swmr=True) as h5:
            return int(h5.attrs["n_written"])
    except (OSError, KeyError):
        return -1


def assert_same_cache(a: Path, b: Path) -> None:
    """Every dataset and every run-independent attribute of two cache files is equal."""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        names_a, names_b = [], []
        fa.visit(lambda n: names_a.append(n) if isinstance(fa[n], h5py.Dataset) else None)
        fb.visit(lambda n: names_b.append(n) if isinstance(fb[n], h5py.Dataset) else None)
        assert sorted(names_a) == sorted(names_b)
        for name in names_a:
            da, db = fa[name], fb[name]
            assert da.shape == db.shape and da.dtype == db.dtype, name
            np.testing.assert_array_equal(da[()], db[()], err_msg=name)
        for key in ("n_written", "n_skipped", "complete", "n_images", "images_sha256", "hooks", "weights_fingerprint",
                    "dtype", "tokens", "layout"):
            assert fa.attrs[key] == fb.attrs[key], key


@pytest.mark.slow  # a 60-image run, killed twice
def test_kill_at_random_moments_then_resume_gives_the_uninterrupted_file(tmp_path):
    model = make_model("vit")
    weights = tmp_path / "w.pth"
    torch.save(model.timm_model.state_dict(), weights)
    folder = write_images(tmp_path / "imgs", N_IMAGES, corrupt_at=CORRUPT_AT, size=(24, 24))
    reference = tmp_path / "reference.h5"
    with pytest.warns(UserWarning, match="skipped unreadable image"):
        interp.cache.write(model, folder, hooks=HOOKS, path=reference, batch_size=1, progress=False)

    out = tmp_path / "out.h5"
    cmd = ["cache", "vit_small_patch16_224", "--weights", weights, "--depth", "2", "--images", folder, "--hooks",
           *HOOKS, "--out", out, "--batch-size", "1", "--no-progress"]
    rng = random.Random(1234)
    seen = []
    for attempt in range(3):
        before = committed_rows(out)
        proc = Forked(forked_cli, *cmd, *(["--resume"] if attempt else []))
        started = time.monotonic()
        # Attempt 1 dies at a random moment from its start (crash recovery, the first writes); attempts 0 and 2
        # die at a random moment after they have committed new rows.
        deadline = started + (rng.uniform(0.5, 4.0) if attempt == 1 else math.inf)
        while committed_rows(out) <= max(before, 0) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        if attempt == 0:
            with pytest.raises(CacheError, match=rf"being written by another process \(pid {proc.pid}"):
                interp.cache.write(model, folder, hooks=HOOKS, path=out, batch_size=1, resume=True, progress=False)
        if attempt != 1:
            time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, "the writer finished before it was killed; make the run longer"
        seen.append(committed_rows(out))
        if seen[-1] >= 0:
            with pytest.warns(UserWarning, match="incomplete"):
                with interp.cache.open(out) as cache:  # a killed run's file opens and shows its committed rows
                    assert len(cache) == seen[-1] < N_IMAGES - len(CORRUPT_AT)
                    assert cache["blocks.1.hook_resid_post"][:].shape[0] == seen[-1]
    assert seen[0] > 0 and seen[2] > seen[0], f"the kills did not land mid-run: committed rows {seen}"
    assert (tmp_path / "out.h5.lock").exists()  # left by a dead writer; must not block the resume

    with pytest.warns(UserWarning):
        summary = interp.cache.write(model, folder, hooks=HOOKS, path=out, batch_size=1, resume=True, progress=False)
    assert summary.complete and summary.n_written == N_IMAGES - len(CORRUPT_AT)
    assert_same_cache(reference, out)
    assert not list(tmp_path.glob("out.h5.tmp-*"))
