"""Where an SAE training step's time goes: the data path vs the compute, timed inside every step.

Model: ``vit_small_patch16_224`` (random init, depth 1: d = 384), hook ``blocks.0.hook_resid_post``, all 197
tokens of random images in a float16 cache on disk. SAE: TopK, expansion 4 (1536 features), k 32, batch 1024
tokens, windows of 64 images over 8 shards (``benchmarks/sae_throughput.py``'s settings).

Each step of ``interp.sae.train``'s loop is timed in three parts, with the loop's own code paths:
  data     = ``norm.apply(stream.batch(step))``: reading the window's rows from the cache when a sub-stream needs
             a new window, choosing the tokens, shuffling, slicing the batch, normalising (the data path);
  compute  = zero_grad, forward, the architecture's loss, backward, gradient clipping, Adam step;
  metrics  = the loop's per-step statistics (loss, explained variance, L0, dead features).
A round runs one epoch of steps (every training token once) twice: first *cold*, the cache file's pages
dropped from the OS page cache (``posix_fadvise(DONTNEED)``) and a fresh stream, then *warm*, the same steps
again with the file in the page cache. Rounds repeat; the figures are ratios (the data path's share of a step),
never seconds as pass/fail. The data path's tokens/s and a GPU step's need are derived from the same timings.

Usage: python benchmarks/sae_step_profile.py [--images 256] [--rounds 3] [--threads 1] [--device cpu|cuda]
Writes benchmarks/results/sae_step_profile.json and prints the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import interp
from common import write_results
from interp.sae import modules as sae_modules
from interp.sae.data import TokenStream
from interp.sae.setup import prepare_data
from interp.sae.train import TrainSettings

HOOK = "blocks.0.hook_resid_post"
SAE = dict(arch="topk", expansion=4, k=32, tokens_per_step=1024, tokens="all", window_images=64, data_shards=8,
           holdout=0.0, lr=4e-4)
PARTS = ("data", "compute", "metrics")


def write_cache(model, n: int, path: Path) -> Path:
    images = torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(n))
    interp.cache.write(model, images, hooks=HOOK, path=path, progress=False, overwrite=True)
    return path


def evict(path: Path) -> None:
    """Drop the file's pages from the OS page cache (clean pages; Linux)."""
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(data, cfg, arch, module, optimiser, last_fired, steps: range, device: torch.device) -> dict:
    """Per-step seconds of each part over ``steps`` (a fresh stream: its windows are read anew); on a GPU the
    data path includes the copy to the device and each part ends with a synchronisation."""
    stream = TokenStream(data.train, data.counts[data.train], data.read_tokens, cfg.seed, cfg.window_images,
                         cfg.tokens_per_step, cfg.data_shards, range(cfg.data_shards))
    times = {p: [] for p in PARTS}
    for step in steps:
        t0 = time.perf_counter()
        x = data.norm.apply(stream.batch(step)).to(device)
        sync(device)
        t1 = time.perf_counter()
        optimiser.zero_grad()
        pre_codes, codes, x_hat = module(x)
        dead_aux = (step - last_fired) >= cfg.dead_window
        loss, _ = arch.loss(x, pre_codes, codes, x_hat, module, module.get_dictionary(), dead_aux)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.clip_grad)
        optimiser.step()
        sync(device)
        t2 = time.perf_counter()
        with torch.no_grad():
            sse = (x - x_hat).square().sum()
            sst = (x - x.mean(0)).square().sum()
            stats = torch.stack([loss.detach(), 1 - sse / sst, (codes > 0).sum(1).float().mean()]).tolist()
            last_fired[(codes > 0).any(0)] = step + 1
            dead = float(((step + 1 - last_fired) >= cfg.dead_window).float().mean())
        sync(device)
        t3 = time.perf_counter()
        assert np.isfinite(stats).all() and 0 <= dead <= 1
        for part, seconds in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2)):
            times[part].append(seconds)
    return times


def summary(times: dict, batch: int) -> dict:
    step = [sum(parts) for parts in zip(*(times[p] for p in PARTS))]
    shares = [d / s for d, s in zip(times["data"], step)]
    data = np.asarray(times["data"])
    return {"steps": len(step),
            "data_share_of_time": float(data.sum() / sum(step)),  # what throughput sees
            "median_step_data_share": statistics.median(shares),
            "p90_step_data_share": float(np.percentile(shares, 90)),
            "metrics_share_of_time": float(sum(times["metrics"]) / sum(step)),
            "window_steps_share": float((data > 5 * np.median(data)).mean()),  # steps that read a window
            "data_over_compute": float(data.sum() / sum(times["compute"])),
            "data_ms_per_step": float(1e3 * data.mean()),
            # the data path as it is stays under 10 % of a step only for steps at least 9x its time
            "min_step_ms_for_data_under_10pct": float(9e3 * data.mean()),
            "data_path_tokens_per_s": float(batch * len(data) / data.sum()),
            "compute_tokens_per_s": float(batch * len(data) / sum(times["compute"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the SAE's compute; the data path is the CPU's)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    folder = Path(tempfile.mkdtemp(prefix="sae-profile-", dir=os.environ.get("BENCH_TMP")))
    cache = write_cache(model, args.images, folder / "acts.h5")
    epoch = args.images * 197 // SAE["tokens_per_step"]
    cfg = TrainSettings(**SAE, steps=epoch)
    data = prepare_data(model, HOOK, cfg, cache=cache)
    arch = sae_modules.architecture(cfg.arch)(cfg)
    n_features = cfg.expansion * data.rows.d
    module = arch.build(data.rows.d, n_features, cfg.tokens_per_step, data.points).to(device)
    module.train()
    optimiser = torch.optim.Adam(module.parameters(), lr=cfg.lr)
    last_fired = torch.zeros(n_features, dtype=torch.int64, device=device)
    run_steps(data, cfg, arch, module, optimiser, last_fired, range(5), device)  # warm-up: first-call costs
    merged = {mode: {p: [] for p in PARTS} for mode in ("cold", "warm")}
    for _ in range(args.rounds):
        for mode in ("cold", "warm"):
            if mode == "cold":
                evict(cache)
            times = run_steps(data, cfg, arch, module, optimiser, last_fired, range(epoch), device)
            for p in PARTS:
                merged[mode][p] += times[p]
    results = {"images": args.images, "rounds": args.rounds, "steps_per_round": epoch, "threads": args.threads,
               "device": str(device),
               "batch_tokens": cfg.tokens_per_step, "d": data.rows.d, "n_features": n_features,
               **{mode: summary(merged[mode], cfg.tokens_per_step) for mode in merged}}
    # A GPU step (not measured here: no GPU): its matmuls, and the data path's rate that a step of 1 ms (an
    # estimate for these sizes, launch-bound) would need to keep the data path under 10 % of it.
    flops = 6 * cfg.tokens_per_step * data.rows.d * n_features * 2  # encoder + decoder matmuls, forward and backward
    results["step_matmul_gflop"] = flops / 1e9
    results["data_path_tokens_per_s_needed_for_10pct_at_1ms_step"] = 9 * cfg.tokens_per_step / 1e-3
    path = write_results("sae_step_profile" if device.type == "cpu" else f"sae_step_profile_{device.type}", results)
    for key, value in results.items():
        print(f"{key:50s} {value}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
