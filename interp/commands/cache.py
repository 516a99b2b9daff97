"""``interp cache MODEL --images DIR --hooks PATTERN... | --for STUDY,... --out FILE.h5``: write an activation cache.

Under ``torchrun --nproc_per_node K -m interp cache ...`` every rank caches one block of the images
into ``FILE.rank{r}-of-K.h5`` and rank 0 writes FILE.h5 as virtual datasets over the shards.
"""
from __future__ import annotations

import os

from .common import add_model_args, add_output_args, add_strict_arg, model_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "cache", help="cache hook activations over an image folder into an HDF5 file",
        description="Run MODEL over images and store the activations of the chosen hooks in an HDF5 file "
                    "(streamed batch by batch, resumable after a crash, shardable with torchrun).")
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", metavar="DIR", help="folder of images (searched recursively)")
    src.add_argument("--image-list", metavar="FILE", help=".txt/.lst file with one image path per line "
                                                          "(relative paths are relative to the file)")
    p.add_argument("--hooks", nargs="+", default=[], metavar="PATTERN",
                   help="hook names or glob patterns, e.g. 'blocks.*.hook_resid_post' (see `interp hooks MODEL`)")
    p.add_argument("--for", dest="for_studies", default=None, metavar="STUDY[,STUDY...]",
                   help="write exactly the hooks these studies read (with their default options), e.g. "
                        "--for norms,neurons; adds to --hooks")
    p.add_argument("--out", required=True, metavar="FILE.h5", help="cache file to write")
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass and per HDF5 chunk")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="stored float type")
    p.add_argument("--tokens", choices=("all", "prefix", "patches", "cls"), default="all",
                   help="token rows to keep (prefix = CLS + registers); attention maps: query rows")
    p.add_argument("--norms-only", action="store_true", help="store per-token L2 norms [N, T] instead of vectors")
    p.add_argument("--compression", choices=("none", "lzf", "gzip"), default="none")
    p.add_argument("--resume", action="store_true", help="continue an interrupted FILE.h5 (same settings)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing FILE.h5")
    add_strict_arg(p)
    add_output_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..cache import write

    if args.device.startswith("cuda") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        args.device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"  # one GPU per torchrun rank
    if args.image_list and not args.image_list.lower().endswith((".txt", ".lst")):
        from ..errors import ImageError

        raise ImageError(f"--image-list expects a .txt or .lst file, got {args.image_list!r}")
    if not args.hooks and not args.for_studies:
        from ..errors import InterpError

        raise InterpError("say what to cache: --hooks PATTERN... and/or --for STUDY[,STUDY...] (e.g. --for norms)")
    model = model_from_args(args)
    hooks = list(args.hooks)
    if args.for_studies:
        from .registry import hooks_for_studies

        hooks += [h for h in hooks_for_studies(args.for_studies, model.n_layers) if h not in hooks]
    summary = write(
        model, args.images or args.image_list, hooks=hooks, path=args.out, batch_size=args.batch_size,
        dtype=args.dtype, tokens=args.tokens, norms_only=args.norms_only, compression=args.compression,
        resume=args.resume, overwrite=args.overwrite, strict=args.strict, progress=args.progress,
    )
    if args.progress_requested and not args.progress:  # no bar (not a terminal): the summary line still shows
        import sys

        print(summary.line(), file=sys.stderr)
    return 0 if summary.complete else 1
