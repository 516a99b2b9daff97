"""Attribution patching's cost against one forward and backward pass (issue 50: at most about 3x).

``attribution_study`` with ``compare=False`` over every block's ``resid_post`` (every token of every block: each
cell of the block x position sweep) on one batch: two forwards keeping every site (clean, corrupted), one forward
and backward of the metric, and the estimates. The baseline is one plain timm forward and backward of the same
metric on the same batch. Reported: the median over interleaved rounds of the per-round ratio.

    python benchmarks/attribution.py [--model vit_small_patch16_224] [--batch-size 8] [--repeats 3]
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
from interp.studies.causal.attribution import attribution_study  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = interp.load(args.model, pretrained=False, device=args.device)
    plain = model.timm_model
    x = torch.randn(args.batch_size, 3, *model.img_size, device=args.device)
    source = open_source(model=model, images=x, batch_size=args.batch_size)

    def forward_backward():
        inputs = x.clone().requires_grad_(True)
        logits = plain(inputs)
        logits.gather(-1, logits.argmax(-1, keepdim=True)).sum().backward()
        plain.zero_grad(set_to_none=True)

    def attribution():
        return attribution_study(source, site="resid_post", metric="prob", corruption="noise", compare=False,
                                 progress=False)

    times = interleaved_times({"attribution": attribution, "forward_backward": forward_backward}, args.repeats,
                              warmup=1)
    ratio = median_ratio(times, "attribution", "forward_backward")
    print(f"{args.model}, batch {args.batch_size}: attribution patching of every block x token / one forward and "
          f"backward = {ratio:.2f}x")
    print(write_results("attribution", {"model": args.model, "batch_size": args.batch_size, "ratio": ratio,
                                        "times": times}))


if __name__ == "__main__":
    main()
