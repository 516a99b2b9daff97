"""Masking probe throughput vs a plain timm forward (ViT-S/16, random init, CPU, float32, no grad).

The probe (``interp.studies.aggregation.masking.masking_study``) on N images with F fractions and both orders runs one
unmasked forward (Patch Scores, predictions, norms) plus 2F masked forwards per batch. The plain baseline is
``timm_model(x)`` on the same number of masked images (2F forwards per batch). Reported, as medians of
per-round ratios over interleaved rounds:

* ``ratio_per_masked_image``: images/s of the probe counting the 2F x N masked images only, over the plain
  forward's images/s. The probe's own unmasked pass bounds it by 2F / (2F + 1) (0.857 for F = 3).
* ``ratio_per_forwarded_image``: the same counting every image the probe forwards (2F + 1) x N: the
  overhead of masking, hooks and scoring. Target >= 0.9.

    python benchmarks/masking.py [--images 32] [--batch-size 32] [--fractions 0.1 0.5 0.9] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interp  # noqa: E402
from common import interleaved_times, median_ratio, write_results  # noqa: E402
from interp.studies.aggregation.masking import masking_study  # noqa: E402
from interp.runtime.open import open_source  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    parser.add_argument("--fill", default="zero", choices=("zero", "mean", "blur"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = interp.load("vit_small_patch16_224", pretrained=False, device=args.device)
    plain = model.timm_model
    x = torch.randn(args.images, 3, 224, 224, device=args.device)
    source = open_source(model=model, images=x, batch_size=args.batch_size)
    n_masked_forwards = 2 * len(args.fractions)  # per batch
    batches = [x[i:i + args.batch_size] for i in range(0, args.images, args.batch_size)]

    def probe():
        return masking_study(source, fractions=args.fractions, fill=args.fill, progress=False)

    @torch.no_grad()
    def plain_forward():
        for batch in batches:
            for _ in range(n_masked_forwards):
                plain(batch)

    times = interleaved_times({"probe": probe, "plain": plain_forward}, args.repeats, warmup=1)
    per_masked = median_ratio(times, "plain", "probe")
    per_forwarded = per_masked * (n_masked_forwards + 1) / n_masked_forwards
    masked_images = args.images * n_masked_forwards
    result = {
        "model": "vit_small_patch16_224 (random init)", "device": args.device, "images": args.images,
        "batch_size": args.batch_size, "fractions": args.fractions, "orders": ["top", "bottom"], "fill": args.fill,
        "repeats": args.repeats, "masked_images": masked_images,
        "forwarded_images_probe": args.images * (n_masked_forwards + 1),
        "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "probe_masked_images_per_s": masked_images / statistics.median(times["probe"]),
        "plain_images_per_s": masked_images / statistics.median(times["plain"]),
        "ratio_per_masked_image": per_masked,
        "ratio_per_forwarded_image": per_forwarded,
        "ceiling_per_masked_image": n_masked_forwards / (n_masked_forwards + 1),
        "targets": {"ratio_per_forwarded_image": 0.9},
    }
    path = write_results("masking", result)
    print(f"plain timm forward  {result['plain_images_per_s']:.1f} images/s")
    print(f"masking probe       {result['probe_masked_images_per_s']:.1f} masked images/s")
    print(f"ratio per masked image     {per_masked:.3f}  (ceiling {result['ceiling_per_masked_image']:.3f}: "
          "one unmasked pass for the scores)")
    print(f"ratio per forwarded image  {per_forwarded:.3f}  (target >= 0.9)")
    print(f"written {path}")


if __name__ == "__main__":
    main()
