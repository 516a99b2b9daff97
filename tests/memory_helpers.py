"""Memory measurements of the studies: a lazily generated 1000-image cache, and the peak resident set size of a
run (VmHWM, reset through ``/proc/self/clear_refs``: it counts torch's allocations too, which tracemalloc does
not see), measured in a child forked from the test process."""
from __future__ import annotations

import json
from typing import Any, Tuple

import numpy as np

from forked import Forked
from interp.models.layout import TokenLayout


class LazyHookView:
    """One hook of :class:`LazyReader`: rows made on demand from a per-row seed (nothing is stored)."""

    def __init__(self, reader: "LazyReader", layer: int):
        self.reader, self.layer = reader, layer

    def __len__(self) -> int:
        return len(self.reader.ids)

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, _ = key.indices(len(self))
        r = self.reader
        out = np.random.default_rng([start, self.layer]).standard_normal(
            (stop - start, r.layout.n_tokens, r.d_model), dtype=np.float32)
        if self.layer == r.n_layers - 1:
            out[:, r.layout.n_prefix:r.layout.n_prefix + r.n_outliers] *= 20  # a few high-norm patches per image
        return out


class LazyReader:
    """The part of ``interp.cache.Reader`` that ``CacheSource`` uses, over ``n_images`` synthetic images of
    full [t, d] residual activations generated per slice: what a 1000-image cache looks like to a study."""

    def __init__(self, n_images: int, n_layers: int = 2, d_model: int = 64, n_outliers: int = 3):
        self.layout = TokenLayout(n_prefix=1, n_registers=0, cls_index=0, grid=(14, 14))
        self.n_layers, self.d_model, self.n_outliers = n_layers, d_model, n_outliers
        self.model_depth = n_layers
        self.ids = [f"image_{i}" for i in range(n_images)]
        self.hooks = [f"blocks.{i}.hook_{s}" for i in range(n_layers) for s in ("resid_mid", "resid_post")]
        self.meta = {"model_name": "lazy", "weights_fingerprint": "0" * 16, "norms_only": False}

    def __getitem__(self, hook: str) -> LazyHookView:
        return LazyHookView(self, int(hook.split(".")[1]))


def peak_growth(fn) -> Tuple[int, Any]:
    """(bytes the peak RSS grew by while ``fn()`` ran, its result); Linux only (``/proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS to the current RSS
    base = _status_kb("VmRSS:")
    out = fn()
    return (_status_kb("VmHWM:") - base) * 1024, out


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def measured_in_a_child(fn) -> dict:
    """``fn()`` (a dict) run in a child forked from the test process: memory measured there starts from one
    process's state, and what the run allocates dies with it."""
    def child():
        print(json.dumps(fn()))

    with Forked(child, capture=True) as run:
        out, err = run.communicate()
    assert run.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])
