"""Memory measurements of the studies: a lazily generated 1000-image cache, and the peak resident set size of a
run (VmHWM, reset through ``/proc/self/clear_refs``: it counts torch's allocations too, which tracemalloc does
not see), measured in a fresh interpreter."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional, Tuple

import numpy as np
import torch

import early
from interp.models.layout import TokenLayout
from interp.studies import CacheSource
from interp.studies.artifacts.norms import norms_study
from interp.studies.probes.probes import probes_study

TESTS = Path(__file__).resolve().parent
CLEAR_REFS = Path("/proc/self/clear_refs")  # Linux: resets the peak RSS


# Distinct synthetic images per layer: image i is noise image i % NOISE_IMAGES. Drawing fresh normals for every
# row read took 4 s of the memory process; a copy of stored rows costs a tenth of that. The stored noise (4 MB at
# 1025 tokens x 32 dims) is made by the warm-up runs, before any peak is measured.
NOISE_IMAGES = 31
_NOISE: dict = {}  # (tokens, width, layer) -> float32 [NOISE_IMAGES, tokens, width]


def _noise(n_tokens: int, d_model: int, layer: int) -> np.ndarray:
    key = (n_tokens, d_model, layer)
    if key not in _NOISE:
        _NOISE[key] = np.random.default_rng(list(key)).standard_normal((NOISE_IMAGES, n_tokens, d_model),
                                                                        dtype=np.float32)
    return _NOISE[key]


class LazyHookView:
    """One hook of :class:`LazyReader`: rows made on demand (copies of a few stored noise images; the
    [N, t, d] data are never held)."""

    def __init__(self, reader: "LazyReader", layer: int):
        self.reader, self.layer = reader, layer

    def __len__(self) -> int:
        return len(self.reader.ids)

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, _ = key.indices(len(self))
        r = self.reader
        out = _noise(r.layout.n_tokens, r.d_model, self.layer)[np.arange(start, stop) % NOISE_IMAGES]
        if self.layer == r.n_layers - 1:
            out[:, r.layout.n_prefix:r.layout.n_prefix + r.n_outliers] *= 20  # a few high-norm patches per image
        return out


class LazyReader:
    """The part of ``interp.cache.CacheReader`` that ``CacheSource`` uses, over ``n_images`` synthetic images of
    full [t, d] residual activations made per read (:class:`LazyHookView`): what a 1000-image cache looks like to a study."""

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
    with open(CLEAR_REFS, "w") as f:
        f.write("5")  # reset the peak RSS to the current RSS
    base = _status_kb("VmRSS:")
    out = fn()
    return (_status_kb("VmHWM:") - base) * 1024, out


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def measured_in_a_fresh_process(name: str) -> dict:
    """The dict the early launch ``name`` printed from a fresh interpreter (the test is marked ``early(name)``).
    A process that ran other work first holds free memory that would serve the
    measured allocations without growing the RSS (a forked child inherits it too), so the measurement would
    depend on what ran before."""
    run = early.result(name)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@early.launcher("studies_memory")
def launch_studies_memory(workdir: Path) -> Optional[early.Launch]:
    """One fresh interpreter measures the probes and the norms studies (:func:`studies_memory`), then the SAE
    line's data set-up and feature report (``tests/sae/sae_memory.py``): ``{"probes", "norms", "sae"}``."""
    if not CLEAR_REFS.exists():
        return None  # the tests skip: no way to reset the peak RSS
    code = (f"import json, sys; sys.path[:0] = [{str(TESTS)!r}, {str(TESTS / 'sae')!r}]; import memory_helpers, "
            "sae_memory; print(json.dumps({**memory_helpers.studies_memory(), 'sae': sae_memory.measure()}))")
    # glibc's malloc raises its mmap threshold as large blocks are freed, after which freed memory stays in the
    # heap and the peak depends on the order of earlier frees (the same probes run measured 10.5-15.6 MB);
    # a fixed threshold returns every large block on free (16.3-16.6 MB over three runs), so one measurement
    # after another in the same interpreter reads as it would alone.
    return early.Launch([sys.executable, "-c", code], env={"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)})


def studies_memory() -> dict:
    """``{"probes": probes_memory(), "norms": norms_memory()}``, in one interpreter (one start-up less); the
    probes first, whose 1x-to-4x growth has the smaller margin, as they would run alone."""
    probes = probes_memory()
    return {"probes": probes, "norms": norms_memory()}


def norms_memory() -> dict:
    reader = LazyReader(1000)
    norms_study(CacheSource(LazyReader(20)), progress=False)  # warm-up: lazy imports, allocator pools
    whole, _ = peak_growth(lambda: reader["blocks.0.hook_resid_post"][0:1000].sum())
    study, result = peak_growth(lambda: norms_study(CacheSource(reader), progress=False))
    return {"whole_hook": whole, "study": study, "artifacts_found": result.artifacts_found,
            "outlier_counts": result.outlier_counts}


def probes_memory() -> dict:
    torch.set_num_threads(1)
    kw = dict(tasks=("position",), max_train_tokens=8000, max_test_tokens=4000, progress=False,
              probe_options={"epochs": 1, "min_steps": 10, "batch_size": 1024})
    probes_study(CacheSource(LazyReader(20)), **kw)  # warm-up
    reader = LazyReader(1000)
    whole, _ = peak_growth(lambda: reader["blocks.1.hook_resid_post"][0:1000].sum())
    quarter, _ = peak_growth(lambda: probes_study(CacheSource(LazyReader(250)), **kw))
    study, result = peak_growth(lambda: probes_study(CacheSource(reader), **kw))
    return {"whole_hook": whole, "study": study, "quarter": quarter, "n_train_tokens": result.n_train_tokens,
            "high": result.position["high_norm"].n}
