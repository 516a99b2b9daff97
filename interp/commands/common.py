"""Arguments shared by several sub-commands (model selection), and building the model from them."""
from __future__ import annotations

import argparse


def add_model_args(parser: argparse.ArgumentParser, model_optional: bool = False) -> None:
    """MODEL positional plus --weights, --pretrained/--no-pretrained, --device, --img-size."""
    if model_optional:
        parser.add_argument("model", nargs="?", default=None, help="timm model name")
    else:
        parser.add_argument("model", help="timm model name, e.g. vit_small_patch14_reg4_dinov2")
    parser.add_argument("--weights", default=None, help="local .safetensors/.pth/.bin state dict for MODEL")
    parser.add_argument("--pretrained", dest="pretrained", action="store_true", default=True,
                        help="load hub weights (default; local HF cache when offline)")
    parser.add_argument("--no-pretrained", dest="pretrained", action="store_false",
                        help="random weights (no download)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument("--img-size", type=int, default=None, help="input size (timm img_size kwarg)")
    parser.add_argument("--depth", type=int, default=None, help="keep only the first N blocks (quick tests)")


def model_from_args(args: argparse.Namespace, dtype=None):
    """Load the HookedViT the model arguments describe."""
    from ..api import load

    kwargs = {}
    if getattr(args, "img_size", None):
        kwargs["img_size"] = args.img_size
    if getattr(args, "depth", None):
        kwargs["depth"] = args.depth
    return load(args.model, pretrained=args.pretrained, weights=args.weights, device=args.device, dtype=dtype,
                **kwargs)


def add_study_args(parser: argparse.ArgumentParser, cache_ok: bool = True) -> None:
    """Arguments of every ``interp study NAME``: model args, --images/--cache, --out, --batch-size, --seed."""
    add_model_args(parser)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="image directory (DIR/<class>/img gives labels), list file or image")
    if cache_ok:
        src.add_argument("--cache", help="an interp cache file (.h5) to read activations from")
    parser.add_argument("--out", required=True, help="output directory for <study>.json and PNGs")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)


def source_from_args(args: argparse.Namespace, model):
    """The activation source the study arguments describe (live images or a cache checked against model)."""
    from ..studies.source import open_source

    return open_source(model=model, images=args.images, cache=getattr(args, "cache", None),
                       batch_size=args.batch_size)


def write_outputs(result, out_dir, figures=()) -> None:
    """Write ``<study>.json`` and the given (name, matplotlib figure) pairs as PNGs into ``out_dir``."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result.to_json(out / f"{result.study}.json")
    for name, fig in figures:
        fig.savefig(out / f"{name}.png", dpi=110, bbox_inches="tight")
    print(f"wrote {out / (result.study + '.json')}" + (f" and {len(figures)} figure(s)" if figures else ""))
