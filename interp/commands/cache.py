"""``interp cache MODEL --images DIR --hooks PATTERN... | --for STUDY,... --out FILE.h5``: write an activation cache.

Under ``torchrun --nproc_per_node K -m interp cache ...`` every rank caches one block of the images
into ``FILE.rank{r}-of-K.h5`` and rank 0 writes FILE.h5 as virtual datasets over the shards.
"""
from __future__ import annotations

import os

from .common import (add_model_args, add_output_args, add_preprocess_args, add_strict_arg, model_from_args,
                     preprocess_arg)
from ..studies.catalog import declared, hooks_for_studies
from ..values import existing_path, image_list_file, positive_int


def _study_names(text: str) -> list:
    """``--for norms, neurons`` -> ["norms", "neurons"]."""
    return [s.strip() for s in text.split(",") if s.strip()]


def register(sub) -> None:
    p = sub.add_parser(
        "cache", help="cache hook activations over an image folder into an HDF5 file",
        description="Run MODEL over images and store the activations of the chosen hooks in an HDF5 file "
                    "(streamed batch by batch, resumable after a crash, shardable with torchrun).")
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", metavar="DIR", type=existing_path, help="folder of images (searched recursively)")
    src.add_argument("--image-list", metavar="FILE", type=image_list_file,
                     help=".txt/.lst file with one image path per line (relative paths are relative to the file)")
    p.add_argument("--hooks", nargs="+", default=[], metavar="PATTERN",
                   help="hook names or glob patterns, e.g. 'blocks.*.hook_resid_post' (see `interp hooks MODEL`)")
    p.add_argument("--for", dest="for_studies", default=None, metavar="STUDY[,STUDY...]",
                   help="write exactly the hooks these studies read (with their default options), e.g. "
                        "--for norms,neurons; adds to --hooks")
    p.add_argument("--out", required=True, metavar="FILE.h5", help="cache file to write")
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per forward pass and per HDF5 chunk")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="stored float type")
    p.add_argument("--tokens", choices=("all", "prefix", "patches", "cls"), default="all",
                   help="token rows to keep (prefix = CLS + registers); attention maps: query rows")
    p.add_argument("--norms-only", action="store_true", help="store per-token L2 norms [N, T] instead of vectors")
    p.add_argument("--compression", choices=("none", "lzf", "gzip"), default="none",
                   help="HDF5 compression of the stored activations (default none: fastest to read)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted FILE.h5 (same settings)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing FILE.h5")
    add_strict_arg(p)
    add_preprocess_args(p)
    add_output_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import UsageError
    from .output import check_output_file
    from .prechecks import check_cache_lock

    preprocess = preprocess_arg(args)
    if not args.hooks and not args.for_studies:
        raise UsageError("say what to cache: --hooks PATTERN... and/or --for STUDY[,STUDY...] (e.g. --for norms)")
    check_output_file(args.out, overwrite=args.overwrite, resume=args.resume, example="acts.h5",
                      hint="pass --resume to continue it, --overwrite to replace it, or choose another path")
    check_cache_lock(args.out)  # another writer: said before torch loads, not after the model is built
    if args.for_studies:
        studies = declared()
        unknown = [s for s in _study_names(args.for_studies) if s not in studies]
        if unknown:
            raise UsageError(f"--for {args.for_studies!r}: unknown study {unknown[0]!r}; known: {', '.join(studies)}")
    from ..cache import write  # imports torch: after the checks above
    from ..cache.format import weights_source

    model = model_from_args(args)
    hooks = list(args.hooks)
    if args.for_studies:
        hooks += [h for h in hooks_for_studies(_study_names(args.for_studies), model.block_names) if h not in hooks]
    replacing = os.path.exists(args.out) and not args.resume
    try:
        summary = write(
            model, args.images or args.image_list, hooks=hooks, path=args.out, batch_size=args.batch_size,
            dtype=args.dtype, tokens=args.tokens, norms_only=args.norms_only, compression=args.compression,
            resume=args.resume, overwrite=args.overwrite, strict=args.strict, progress=args.progress,
            # Recorded so that a mismatch can say how to load these weights again (seed: random weights).
            weights_source=weights_source(pretrained=args.pretrained and not args.weights, weights=args.weights,
                                          seed=getattr(model, "init_seed", None)),
            preprocess=preprocess,
        )
    except KeyboardInterrupt:
        raise KeyboardInterrupt(interrupted_note(args, replacing)) from None
    if args.progress_requested and not args.progress:  # no bar (not a terminal): the summary line still shows
        import sys

        print(summary.line(), file=sys.stderr)
    return 0 if summary.complete else 1


def interrupted_note(args, replacing: bool) -> str:
    """What an interrupted ``interp cache`` kept, and the command that continues it."""
    import shlex

    from ..cache.integrity import open_read_only

    if replacing:
        return f"{args.out} is unchanged (an interrupted --overwrite keeps the old file)"
    if not os.path.exists(args.out):
        return f"nothing was committed to {args.out}; rerun the command to start again"
    argv = [a for a in getattr(args, "argv", []) if a != "--overwrite"] or ["cache", args.model, "..."]
    resume = shlex.join(["interp", *argv, *([] if "--resume" in argv else ["--resume"])])
    try:
        h5, _ = open_read_only(args.out)
        with h5:
            kept = f"{int(h5.attrs['n_written'])} of {int(h5.attrs['n_images'])} images are committed in {args.out}"
    except Exception:  # noqa: BLE001 - the note must not hide the interrupt; the resume run checks the file
        kept = f"the rows committed to {args.out} so far are kept"
    return f"{kept}; continue with `{resume}`"
