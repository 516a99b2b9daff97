"""Throughput and peak memory of ``interp.cache.write`` on CPU.

Model: ViT-S/16 (``vit_small_patch16_224``, random init), hooks ``blocks.*.hook_resid_post`` (12 hooks),
stored as float16, batch size 32.

1. Throughput, 512 synthetic images (an in-memory Tensor), measured in one process, sequentially:
     cache    = wall time of ``interp.cache.write``
     baseline = plain timm forward of the same batches + raw h5py write of the same bytes
   ratio = cache / baseline (target <= 1.0: streaming costs nothing beyond the work itself). Five rounds
   in rotating order after one warm-up of each phase; the median is reported (the machine may be shared).
2. Peak RSS of a cache run over 256 and 1024 PNG files, each in a fresh subprocess (``VmHWM``; see
   ``peak_rss_mb``); streaming means they should differ by < 10 %.

Usage: python benchmarks/cache_throughput.py [--images 512] [--batch-size 32] [--rounds 5]
Writes benchmarks/results/cache_throughput.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

MODEL = "vit_small_patch16_224"
HOOKS = "blocks.*.hook_resid_post"
RESULTS = Path(__file__).resolve().parent / "results" / "cache_throughput.json"


def load_model():
    import interp

    torch.manual_seed(0)
    return interp.load(MODEL, pretrained=False)


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run_cache(model, x, path: Path, batch_size: int) -> None:
    import interp.cache

    interp.cache.write(model, x, hooks=HOOKS, path=path, batch_size=batch_size, dtype="float16", overwrite=True,
                       progress=False)


def run_forward(model, x, batch_size: int) -> None:
    """Plain timm forward (no hooks, no copies) of the same batches."""
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            model.timm_model(x[i:i + batch_size])


def read_cache_arrays(cache_path: Path) -> dict:
    with h5py.File(cache_path, "r") as src:
        return {f"acts/{h}": src[f"acts/{h}"][()] for h in json.loads(src.attrs["hooks"])}


def run_raw_write(data: dict, path: Path, batch_size: int) -> None:
    """h5py write of the same bytes (same datasets, dtype and chunks), batch by batch."""
    n_rows = len(next(iter(data.values())))
    with h5py.File(path, "w") as dst:
        sets = {n: dst.create_dataset(n, shape=a.shape, dtype=a.dtype, chunks=(batch_size, *a.shape[1:]))
                for n, a in data.items()}
        for i in range(0, n_rows, batch_size):
            for n, a in data.items():
                sets[n][i:i + batch_size] = a[i:i + batch_size]


def throughput(n_images: int, batch_size: int, rounds: int, workdir: Path) -> dict:
    """``rounds`` measurements of the three phases, in a rotating order so a change of machine load during
    the run does not always hit the same phase; the ratio of each round and their median are reported."""
    model = load_model()
    x = torch.randn(n_images, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    run_forward(model, x[:batch_size], batch_size)  # warm-up (thread pools, allocator)
    cache_path, raw_path = workdir / "cache.h5", workdir / "raw.h5"
    run_cache(model, x[:batch_size], cache_path, batch_size)
    run_cache(model, x, cache_path, batch_size)  # also produces the bytes the raw write stores
    data = read_cache_arrays(cache_path)  # in memory before any clock starts
    nbytes = sum(a.nbytes for a in data.values())
    run_raw_write(data, raw_path, batch_size)  # warm-up of the raw write too
    phases = {
        "cache": lambda: run_cache(model, x, cache_path, batch_size),
        "forward": lambda: run_forward(model, x, batch_size),
        "raw_write": lambda: run_raw_write(data, raw_path, batch_size),
    }
    order = list(phases)
    runs = []
    for r in range(rounds):
        row = {}
        for name in order[r % 3:] + order[:r % 3]:
            cache_path.unlink(missing_ok=True)  # deleting the previous output is not part of any phase
            raw_path.unlink(missing_ok=True)
            row[f"{name}_s"], row[f"{name}_cpu_s"] = timed(phases[name])
        row["ratio"] = row["cache_s"] / (row["forward_s"] + row["raw_write_s"])
        row["cpu_ratio"] = row["cache_cpu_s"] / (row["forward_cpu_s"] + row["raw_write_cpu_s"])
        runs.append(row)
    median = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    return {
        "images": n_images, "batch_size": batch_size, "bytes": nbytes, "runs": runs,
        "cache_s": median["cache_s"], "forward_s": median["forward_s"], "raw_write_s": median["raw_write_s"],
        "ratio": median["ratio"], "best_ratio": min(r["ratio"] for r in runs), "cpu_ratio": median["cpu_ratio"],
        "cache_images_per_s": n_images / median["cache_s"], "cache_mb_per_s": nbytes / 1e6 / median["cache_s"],
    }


# ---------------------------------------------------------------------------------------------- memory
def make_png_folder(folder: Path, n: int) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(folder / f"{i:05d}.png")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far.

    Linux: ``VmHWM`` of /proc/self/status. ``ru_maxrss`` is not used there: at exec the kernel folds the
    forking parent's RSS into it, so a child of a big benchmark process would report the parent's size.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale / 1024


def rss_child(listing: str, out: str, batch_size: int) -> None:
    """Run one cache write in this fresh process and print its peak RSS (before and after) as JSON."""
    import interp.cache

    model = load_model()
    before = peak_rss_mb()
    t0 = time.perf_counter()
    summary = interp.cache.write(model, listing, hooks=HOOKS, path=out, batch_size=batch_size, dtype="float16",
                                 overwrite=True, progress=False)
    print(json.dumps({"images": summary.n_written, "peak_rss_mb": peak_rss_mb(), "peak_rss_before_write_mb": before,
                      "seconds": time.perf_counter() - t0}))


def peak_rss(counts, batch_size: int, workdir: Path) -> list:
    folder = workdir / "pngs"
    make_png_folder(folder, max(counts))
    files = sorted(folder.iterdir())
    results = []
    for n in counts:
        listing = workdir / f"list{n}.txt"
        listing.write_text("\n".join(str(p) for p in files[:n]) + "\n")
        out = workdir / f"rss{n}.h5"
        done = subprocess.run([sys.executable, __file__, "--rss-child", str(listing), str(out), str(batch_size)],
                              capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        out.unlink()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (the median is reported)")
    parser.add_argument("--rss-counts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--rss-child", nargs=3, metavar=("LIST", "OUT", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_child[0], args.rss_child[1], int(args.rss_child[2]))
        return

    with tempfile.TemporaryDirectory(prefix="interp-cache-bench-") as tmp:
        workdir = Path(tmp)
        speed = throughput(args.images, args.batch_size, args.rounds, workdir)
        memory = peak_rss(args.rss_counts, args.batch_size, workdir)
    growth = memory[-1]["peak_rss_mb"] / memory[0]["peak_rss_mb"] - 1
    result = {
        "model": MODEL, "hooks": HOOKS, "dtype": "float16", "device": "cpu",
        "torch_threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "throughput": speed, "peak_rss": memory, "rss_growth": growth,
        "target_ratio_met": speed["ratio"] <= 1.0, "target_rss_met": abs(growth) < 0.10,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    mb = speed["bytes"] / 1e6
    print(f"interp.cache.write throughput: {MODEL}, {speed['images']} images, batch {speed['batch_size']}, "
          f"{HOOKS} float16 ({mb:.0f} MB), {torch.get_num_threads()} CPU threads")
    print(f"  median of {len(speed['runs'])} rounds (rotating order); per round: "
          + ", ".join(f"{r['ratio']:.3f}" for r in speed["runs"]))
    print(f"  {'interp.cache.write':<34}{speed['cache_s']:8.2f} s  {speed['cache_images_per_s']:7.1f} img/s  "
          f"{speed['cache_mb_per_s']:7.1f} MB/s")
    print(f"  {'timm forward':<34}{speed['forward_s']:8.2f} s")
    print(f"  {'raw h5py write':<34}{speed['raw_write_s']:8.2f} s")
    print(f"  {'ratio cache / (forward + write)':<34}{speed['ratio']:8.3f}    (target <= 1.0; best round "
          f"{speed['best_ratio']:.3f}; CPU-time ratio {speed['cpu_ratio']:.3f})")
    print("peak RSS of a cache run (fresh process, PNG files):")
    for row in memory:
        print(f"  {row['images']:>5} images  {row['peak_rss_mb']:8.1f} MB  (model loaded: "
              f"{row['peak_rss_before_write_mb']:.1f} MB; {row['seconds']:.1f} s)")
    print(f"  growth {memory[0]['images']} -> {memory[-1]['images']} images: {growth * 100:+.1f} %  (target < 10 %)")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
