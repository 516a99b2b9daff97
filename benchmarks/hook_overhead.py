"""Hook overhead: HookedViT vs plain timm forward (ViT-S/16 by default, batch 16, CPU, float32, no grad).

(a) hooked forward with no hooks attached, (b) ``run_with_cache`` of every ``hook_resid_post``; each as the
median of per-round ratios over interleaved rounds. Targets: (a) <= 1.03, (b) <= 1.10.

    python benchmarks/hook_overhead.py [--repeats 15] [--batch-size 16] [--device cpu] [--model NAME]

``--model`` measures another family's model (random weights at its default size, e.g. ``vit_small_patch16_dinov3``,
``eva02_small_patch14_224``, ``pvt_v2_b0``, ``swinv2_tiny_window8_256``); its results go to ``hook_overhead_NAME.json``.
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


DEFAULT_MODEL = "vit_small_patch16_224"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = interp.load(args.model, pretrained=False, device=args.device)
    plain = model.timm_model
    x = torch.randn(args.batch_size, 3, *model.img_size, device=args.device)

    @torch.no_grad()
    def timm_forward():
        return plain(x)

    @torch.no_grad()
    def hooked_forward():
        return model(x)

    @torch.no_grad()
    def hooked_cache():
        return model.run_with_cache(x, names_filter=model.block_names.every("hook_resid_post"))

    times = interleaved_times({"timm": timm_forward, "hooked": hooked_forward, "cache": hooked_cache}, args.repeats)
    result = {
        "model": args.model, "img_size": list(model.img_size), "batch_size": args.batch_size, "device": args.device,
        "repeats": args.repeats,
        "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "ratio_hooked_no_hooks": median_ratio(times, "hooked", "timm"),
        "ratio_run_with_cache_resid_post": median_ratio(times, "cache", "timm"),
        "targets": {"ratio_hooked_no_hooks": 1.03, "ratio_run_with_cache_resid_post": 1.10},
    }
    path = write_results("hook_overhead" if args.model == DEFAULT_MODEL else f"hook_overhead_{args.model}", result)
    print(f"timm forward            {result['median_seconds']['timm']:.4f} s (median)")
    print(f"(a) hooked, no hooks    ratio {result['ratio_hooked_no_hooks']:.3f}  (target <= 1.03)")
    print(f"(b) cache resid_post    ratio {result['ratio_run_with_cache_resid_post']:.3f}  (target <= 1.10)")
    print(f"written {path}")


if __name__ == "__main__":
    main()
