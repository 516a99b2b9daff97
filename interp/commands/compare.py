"""``interp compare MODEL [MODEL ...] --images DIR``: the norms battery and the linear probes on several
models, one table (the reassessment's)."""
from __future__ import annotations

import argparse

from .common import add_output_args, add_overwrite_arg, refuse_existing_file, write_outputs


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare high-norm artifacts across models (one table)",
                       description="Run the norms study on each model over the same images; print one table.")
    p.add_argument("models", nargs="+", help="timm model names (or planted_vit)")
    p.add_argument("--images", default=None, help="image directory (default: the bundled sample photos)")
    p.add_argument("--weights", nargs="*", default=None, help="one local weight file per model, in order")
    p.add_argument("--no-pretrained", dest="pretrained", action="store_false", default=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threshold", default="auto", help="auto | pNN | a norm value")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--no-probes", dest="probes", action="store_false", default=True,
                   help="skip the linear probes (position / pixels / global per token group)")
    p.add_argument("--probe-tokens", type=int, default=2000, help="training tokens of each probe (seeded sample)")
    p.add_argument("--strict", action="store_true", help="stop at the first unreadable image (default: skip it)")
    p.add_argument("--out", default=None, help="write compare.json here")
    add_overwrite_arg(p, "an existing compare.json in --out")
    add_output_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..api import load
    from ..errors import InterpError
    from ..models import sample_image_paths
    from ..studies.compare import compare_models

    if args.weights and len(args.weights) != len(args.models):
        raise InterpError(f"--weights needs one file per model ({len(args.models)}), got {len(args.weights)}")
    if args.out:
        from pathlib import Path

        refuse_existing_file(Path(args.out) / "compare.json", args.overwrite)
    models = [load(name, pretrained=args.pretrained, device=args.device,
                   weights=args.weights[i] if args.weights else None) for i, name in enumerate(args.models)]
    images = args.images or sample_image_paths()
    result = compare_models(models, images, threshold=args.threshold, batch_size=args.batch_size,
                            progress=args.progress, probes=args.probes, probe_tokens=args.probe_tokens,
                            strict=args.strict)
    print(result.table())
    if args.out:
        write_outputs(result, args.out)
    return 0
