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
