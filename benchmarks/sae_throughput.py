"""SAE training: peak memory at 1x and 4x the data, DDP 2 vs 1 (the data path's share of a step:
``sae_step_profile.py``).

Model: ``vit_small_patch16_224`` (random init, depth 1: d = 384), hook ``blocks.0.hook_resid_post``, all 197
tokens of random images, float16 cache. SAE: TopK, expansion 4 (1536 features), k 32, batch 1024 tokens.

1. (removed: whole loops' tokens/s from the cache over overcomplete's loop in memory, one 20-step difference on a
   loaded machine, measured 0.74 and 1.32 in two runs; ``sae_step_profile.py`` times the data path inside every step)
2. Peak RSS (``ru_maxrss`` of a fresh process, reported by itself) of ``interp sae train`` on caches of N and 4N
   images (the process holds torch, the model and overcomplete's imports besides the data).
3. Wall time of ``torchrun --nproc_per_node 2`` vs 1 process for the same run (start-up included).

Usage: python benchmarks/sae_throughput.py [--images 64] [--steps 10]
Writes benchmarks/results/sae_throughput.json and prints the figures.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import interp
from common import write_results

ROOT = Path(__file__).resolve().parents[1]
PEAK = ("import resource, sys; from interp.cli import main; rc = main(sys.argv[1:]); "
        "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
HOOK = "blocks.0.hook_resid_post"
CLI = ["--arch", "topk", "--expansion", "4", "--k", "32", "--tokens-per-step", "1024", "--tokens", "all",
       "--window-images", "64", "--data-shards", "8", "--holdout", "0", "--no-pretrained", "--depth", "1"]


def write_cache(model, n: int, path: Path) -> Path:
    images = torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(n))
    interp.cache.write(model, images, hooks=HOOK, path=path, progress=False, overwrite=True)
    return path


def cli(cache: Path, out: Path, steps: int, nproc: int = 0) -> tuple:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INTERP_NO_PROGRESS": "1"}
    args = ["sae", "train", "vit_small_patch16_224", "--cache", str(cache), "--hook", HOOK, "--out", str(out),
            "--steps", str(steps), "--overwrite", *CLI]
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               "-m", "interp", *args]
    else:  # the child reports its own peak RSS (ru_maxrss of RUSAGE_CHILDREN is a maximum over all children)
        cmd = [sys.executable, "-c", PEAK, *args]
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    peaks = [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("PEAK_RSS_KB")]
    return wall, (peaks[0] / 1024 if peaks else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    model = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    folder = Path(tempfile.mkdtemp(prefix="sae-bench-"))
    small = write_cache(model, args.images, folder / "x1.h5")
    large = write_cache(model, 4 * args.images, folder / "x4.h5")
    results = {"images": args.images, "steps": args.steps}
    # fresh processes, in increasing order of data: ru_maxrss of the children is a running maximum
    results["peak_rss_mb_1x"] = cli(small, folder / "r1", args.steps)[1]
    results["peak_rss_mb_4x"] = cli(large, folder / "r4", args.steps)[1]
    results["wall_s_1_process"] = cli(large, folder / "d1", args.steps)[0]
    results["wall_s_2_processes"] = cli(large, folder / "d2", args.steps, nproc=2)[0]
    results["ddp_speedup"] = results["wall_s_1_process"] / results["wall_s_2_processes"]
    path = write_results("sae_throughput", results)
    for key, value in results.items():
        print(f"{key:28s} {value:.4g}" if isinstance(value, float) else f"{key:28s} {value}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
