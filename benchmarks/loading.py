"""What loading a weight file costs besides reading it: the model's construction with timm's random init of the
parameters (what a load did before) against the construction without it (what ``interp.load(weights=...)`` does:
the file sets every parameter), and the NaN/inf check of the loaded weights (``isfinite(t).all()`` per tensor
against the min/max check interp runs). Interleaved rounds, median ratios. Writes ``results/loading.json``.

    python benchmarks/loading.py [--model vit_large_patch14_dinov2] [--rounds 5]
"""
from __future__ import annotations

import argparse

import torch

from common import interleaved_times, median_ratio, write_results
from interp.models.loading import _all_finite, build_architecture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_large_patch14_dinov2")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kwargs = {"img_size": args.img_size}
    tensors = list(build_architecture(args.model, 0, **kwargs).state_dict().values())
    times = interleaved_times({
        "build_with_init": lambda: build_architecture(args.model, 0, **kwargs),
        "build_without_init": lambda: build_architecture(args.model, 0, initialise=False, **kwargs),
        "isfinite_all": lambda: [bool(torch.isfinite(t).all()) for t in tensors],
        "min_max": lambda: [_all_finite(t) for t in tensors],
    }, repeats=args.rounds, warmup=1)
    data = {"model": args.model, "parameters": sum(t.numel() for t in tensors), "rounds": args.rounds,
            "build_with_init_over_without": median_ratio(times, "build_with_init", "build_without_init"),
            "isfinite_over_min_max": median_ratio(times, "isfinite_all", "min_max"),
            "median_s": {k: sorted(v)[len(v) // 2] for k, v in times.items()}}
    print(write_results("loading", data))
    print({k: v for k, v in data.items() if k != "median_s"})


if __name__ == "__main__":
    main()
