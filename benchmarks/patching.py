"""Activation patching's cost against one plain forward, and what batching its cells (``--cells``) buys.

``patching_study`` over every block's ``resid_post`` (every token of every block: the whole block x position sweep,
``depth x tokens`` cells) on one batch: the clean and corrupted runs keeping every site, then one forward per
``cells`` cells (each a copy of the batch). The baseline is one plain timm forward of the same batch. Reported per
``--cells`` value: the median over interleaved rounds of the per-round ratio, and the ratio per cell (the sweep's
cost over its number of cells: 1.0 would be one plain forward per patched cell).

    python benchmarks/patching.py [--model vit_small_patch16_224] [--batch-size 2] [--cells 1 4 16 64]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interp  # noqa: E402
from common import interleaved_times, median_ratio, write_results  # noqa: E402
from interp.runtime.open import open_source  # noqa: E402
from interp.studies.causal.patching import patching_study  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--img-size", type=int, default=None, help="input size (default the model's)")
    parser.add_argument("--depth", type=int, default=None, help="blocks built (default the model's)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--cells", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    kwargs = {k: v for k, v in (("img_size", args.img_size), ("depth", args.depth)) if v is not None}
    model = interp.load(args.model, pretrained=False, device=args.device, **kwargs)
    plain = model.timm_model
    x = torch.randn(args.batch_size, 3, *model.img_size, device=args.device)
    source = open_source(model=model, images=x, batch_size=args.batch_size)
    n_cells = model.n_layers * model.layout.n_tokens

    def forward():
        with torch.no_grad():
            plain(x)

    def sweep(cells):
        return lambda: patching_study(source, site="resid_post", metric="pooled-cosine", corruption="noise",
                                      cells=cells, progress=False)

    fns = {"forward": forward, **{f"patching_cells{c}": sweep(c) for c in args.cells}}
    times = interleaved_times(fns, args.repeats, warmup=1)
    rows = {}
    for c in args.cells:
        ratio = median_ratio(times, f"patching_cells{c}", "forward")
        rows[c] = {"ratio": ratio, "per_cell": ratio / n_cells}
        print(f"{args.model} ({model.n_layers} blocks, {model.img_size[0]} px), batch {args.batch_size}, {n_cells} cells, --cells {c}: patching every block x token / "
              f"one forward = {ratio:.1f}x ({ratio / n_cells:.2f}x per cell)")
    print(write_results("patching", {"model": args.model, "img_size": list(model.img_size), "depth": model.n_layers,
                                      "batch_size": args.batch_size, "n_cells": n_cells, "ratios": rows,
                                      "times": times}))


if __name__ == "__main__":
    main()
