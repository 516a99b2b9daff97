"""What several sub-commands share: model and study arguments, building the model and the activation source
from them and reading --threshold (writing results: :mod:`.saving`). Commands import helpers from here, never
from each other."""
from __future__ import annotations

import argparse
from typing import Dict, List, Sequence

from ..console import add_output_args
from ..errors import InterpError, UsageError
from ..studies.core.options import CLASSIFIER_HELP, ProbeBudgetOptions
from ..values import (NEURONS_SYNTAX, device_arg, existing_file, existing_path, image_size_arg, positive_int, seed_arg,
                     threshold_arg, transform_arg)


def add_model_args(parser: argparse.ArgumentParser, model_optional: bool = False, seed: bool = True) -> None:
    """MODEL positional plus --weights, --pretrained/--no-pretrained, --device, --img-size, --depth,
    --pos-resample and (unless ``seed`` is False: a study's config declares it) --seed."""
    if model_optional:
        parser.add_argument("model", nargs="?", default=None, help="timm model name")
    else:
        parser.add_argument("model", help="timm model name, e.g. vit_small_patch14_reg4_dinov2")
    parser.add_argument("--weights", default=None, type=existing_file,
                        help="local .safetensors/.pth/.bin state dict for MODEL")
    parser.add_argument("--pretrained", dest="pretrained", action="store_true", default=True,
                        help="load hub weights (default; local HF cache when offline)")
    parser.add_argument("--no-pretrained", dest="pretrained", action="store_false",
                        help="random weights (no download)")
    add_device_arg(parser)
    parser.add_argument("--img-size", type=image_size_arg, default=None,
                        help="input size in pixels (timm img_size; resamples the position embedding)")
    parser.add_argument("--depth", type=positive_int, default=None,
                        help="keep only the first N blocks (quick tests)")
    parser.add_argument("--pos-resample", default="auto", choices=("auto", "timm", "dinov2", "dinov2_reg"),
                        help="how --weights' position table is resampled to --img-size: auto (default: DINOv2's "
                             "own arithmetic for an original DINOv2 file, timm's otherwise), timm, dinov2 or "
                             "dinov2_reg")
    if seed:
        add_seed_arg(parser)


def add_seed_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=seed_arg, default=0,
                        help="seed of every random draw of the run: the random weights of --no-pretrained (the same "
                             "seed gives the same model in every command) and the study's own sampling (default 0)")


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", type=device_arg,
                        help="where the model runs: cpu (default), cuda, cuda:N (GPU index) or mps")


def check_device(device: str) -> str:
    """Before the model is built: ``device`` exists on this machine; else a one-line UsageError naming the
    devices that do and what to pass."""
    import warnings

    import torch

    if device == "cpu":
        return device
    with warnings.catch_warnings():  # a broken driver warns here; the error below says it in one line
        warnings.simplefilter("ignore")
        n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    available = ["cpu"] + [f"cuda:{i}" for i in range(n_gpus)] + (["mps"] if mps else [])
    shown = ", ".join(available)
    if device.startswith("cuda"):
        if n_gpus == 0:
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "torch finds no NVIDIA GPU or driver")
            raise UsageError(f"--device {device}: no CUDA GPU on this machine ({why}); available: {shown}; "
                             "pass --device cpu")
        index = int(device.partition(":")[2] or 0)
        if index >= n_gpus:
            raise UsageError(f"--device {device}: this machine has {n_gpus} CUDA GPU(s); available: {shown}")
    elif device == "mps" and not mps:
        raise UsageError(f"--device mps: no Apple MPS device on this machine; available: {shown}")
    return device


LAYER_OPTIONS = (("detect_layer", "--detect-layer"), ("highest_layer", "--highest-layer"), ("layer", "--layer"))


def check_model_args(args: argparse.Namespace, model) -> None:
    """Right after the model is built, before any forward pass: block numbers within the model's depth and a
    ``--hook`` that names one of its hooks (close matches otherwise)."""
    n = model.n_layers
    if 0 in tuple(model.layout.grid):  # an input smaller than one patch: timm builds it, the forward fails
        patch = tuple(getattr(model.timm_model.patch_embed, "patch_size", ()))
        raise UsageError(f"--img-size {getattr(args, 'img_size', None)} is smaller than one patch of {args.model} "
                         f"({'x'.join(map(str, patch)) or '?'} px): give at least {max(patch, default=1)}")
    for attr, flag in LAYER_OPTIONS:
        value = getattr(args, attr, None)
        if value is not None and not -n <= int(value) < n:
            raise UsageError(f"{flag} {value} is out of range: {args.model} has {n} blocks "
                             f"(0..{n - 1}, or -{n}..-1 counted from the end)")
    hook = getattr(args, "hook", None)
    if isinstance(hook, str) and hook not in model.hook_names():
        from ..errors import close_matches

        near = close_matches(hook, model.hook_names())
        hint = f" Close matches: {', '.join(near)}." if near else ""
        raise UsageError(f"--hook {hook!r} is not a hook of {args.model}.{hint} "
                         f"List them with `interp hooks {args.model}`.")


def rank_device(device: str) -> str:
    """``device`` for this process: under torchrun (``WORLD_SIZE`` > 1) a CUDA device is this rank's own GPU
    (``cuda:LOCAL_RANK``)."""
    import os

    if device.startswith("cuda") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    return device


def model_from_args(args: argparse.Namespace, dtype=None):
    """Load the HookedViT the model arguments describe (the device checked first, block numbers after)."""
    from ..hooks.load import load

    kwargs = {}
    if getattr(args, "img_size", None):
        kwargs["img_size"] = args.img_size
    if getattr(args, "depth", None):
        kwargs["depth"] = args.depth
    device = rank_device(args.device)
    check_device(device)
    model = load(args.model, pretrained=args.pretrained, weights=args.weights, device=device, dtype=dtype,
                 seed=getattr(args, "seed", None), pos_resample=getattr(args, "pos_resample", "auto"), **kwargs)
    check_model_args(args, model)
    return model


def add_study_args(parser: argparse.ArgumentParser, inputs: str = "images_or_cache", cache_images: str = "") -> None:
    """The inputs of every ``interp study NAME``: model args, --images/--cache, --out, preprocessing,
    --batch-size, --strict, --overwrite, --no-progress, --quiet. ``inputs``: ``"images"`` (no cache),
    ``"images_or_cache"`` (one of them), ``"images_and_cache"`` (--images adds to a --cache run what
    ``cache_images`` says; the study checks that one is given). The study's own options (--seed among them) come
    from its config."""
    add_model_args(parser, seed=False)
    images_help = "image directory (DIR/<class>/img gives labels), list file or image"
    cache_help = "an interp cache file (.h5) to read activations from"
    if inputs == "images_and_cache":
        parser.add_argument("--images", type=existing_path, help=f"{images_help}; with --cache: {cache_images}")
        parser.add_argument("--cache", type=existing_file, help=cache_help)
    else:
        src = parser.add_mutually_exclusive_group(required=True)
        src.add_argument("--images", type=existing_path, help=images_help)
        if inputs == "images_or_cache":
            src.add_argument("--cache", type=existing_file, help=cache_help)
        else:
            parser.set_defaults(cache=None)
    parser.add_argument("--out", required=True, help="output directory for <study>.json and PNGs")
    add_preprocess_args(parser)
    add_batch_size_arg(parser)
    add_strict_arg(parser)
    add_overwrite_arg(parser, "an existing <study>.json in --out (and the figures it lists)")
    add_output_args(parser)


def add_classifier_arg(parser: argparse.ArgumentParser) -> None:
    """``--classifier FILE``: the class logits of the behaviour metrics (:mod:`interp.models.classifier`)."""
    parser.add_argument("--classifier", type=existing_file, default=None, metavar="FILE", help=CLASSIFIER_HELP)


def add_preprocess_args(parser: argparse.ArgumentParser) -> None:
    """``--resize N [--crop M]`` or ``--transform NAME``: a paper's eval preprocessing instead of timm's own."""
    # dests of their own: a study may have a "crop" option of its own (segment's --no-crop)
    parser.add_argument("--resize", dest="eval_resize", type=positive_int, default=None, metavar="N",
                        help="eval preprocessing: resize the shorter side to N px, then center-crop (--crop, default "
                             "N); e.g. --resize 256 --crop 224 as Jiang et al. and DINOv2's evaluation "
                             "(default: timm's own transform for the model)")
    parser.add_argument("--crop", dest="eval_crop", type=positive_int, default=None, metavar="M",
                        help="center crop M x M after --resize (the model's input size)")
    parser.add_argument("--transform", dest="eval_transform", type=transform_arg, default=None, metavar="NAME",
                        help="the same by name: model (timm's own) or resizeN-cropM, e.g. resize256-crop224")


def preprocess_arg(args: argparse.Namespace):
    """The eval transform name the preprocessing options ask for (None: not given), checked without torch:
    one of ``--transform`` or ``--resize``/``--crop``; ``--crop`` needs ``--resize`` and must fit in it."""
    from .._transforms import check_sizes

    name, resize, crop = (getattr(args, k, None) for k in ("eval_transform", "eval_resize", "eval_crop"))
    if name is not None and (resize is not None or crop is not None):
        raise UsageError(f"give --transform {name} or --resize/--crop, not both")
    if crop is not None and resize is None:
        raise UsageError(f"--crop {crop} needs --resize too (e.g. --resize 256 --crop {crop})")
    if resize is None:
        return name
    try:
        check_sizes(resize, resize if crop is None else crop)
    except ValueError as e:
        raise UsageError(f"--resize/--crop: {e}") from None
    return f"resize{resize}-crop{resize if crop is None else crop}"


def add_probe_budget_args(parser: argparse.ArgumentParser) -> None:
    """The linear probes' budget and schedule (``interp compare``; ``interp study probes`` has them from its
    config): the options of :class:`~interp.studies.core.options.ProbeBudgetOptions`."""
    ProbeBudgetOptions.add_arguments(parser, only=ProbeBudgetOptions.BUDGET)


def probe_budget(args: argparse.Namespace) -> Dict[str, float]:
    """The probe budget options given (``probe_options`` of the probes); --val-fraction needs --patience."""
    return ProbeBudgetOptions(**{k: getattr(args, k, None) for k in ProbeBudgetOptions.BUDGET}).probe_budget()


def add_batch_size_arg(parser: argparse.ArgumentParser, batch_size: int = 16) -> None:
    parser.add_argument("--batch-size", type=positive_int, default=batch_size,
                        help=f"images per forward pass (default {batch_size}; lower it when memory is short)")


def add_threshold_arg(parser: argparse.ArgumentParser, default=None, flag: str = "--threshold",
                      help: str = "", aliases: Sequence[str] = ()) -> None:
    """``--threshold`` (and any former names in ``aliases``) checked at parse time: auto, pNN (0 < NN < 100) or a
    positive norm value."""
    parser.add_argument(flag, *aliases, type=threshold_arg, default=default,
                        help=help or "outlier norm threshold: a norm value > 0, pNN (percentile, e.g. p98) or auto "
                                     "(bimodal split)" + ("" if default is None else f"; default {default}"))


def add_detection_args(parser: argparse.ArgumentParser, threshold_help: str = "",
                       threshold_aliases: Sequence[str] = ()) -> None:
    """``--threshold`` (and its former names ``threshold_aliases``), ``--preset``, ``--detect-layer``: what a
    ``DetectionSpec`` holds (the studies resolve it)."""
    from ..detection.presets import PRESETS  # torch-free

    add_threshold_arg(parser, aliases=threshold_aliases,
                      help=threshold_help or "outlier norm threshold: a norm value > 0, pNN (e.g. p98) or auto "
                                             "(default, or the preset's)")
    parser.add_argument("--preset", default=None,
                        help=f"published settings: {', '.join(PRESETS)} (explicit flags win)")
    parser.add_argument("--detect-layer", type=int, default=None,
                        help="block whose output decides outliers (default: last; negative counts from the end)")


def add_strict_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict", action="store_true",
                        help="stop at the first unreadable image (default: skip it, warn, list it under 'skipped')")


def add_overwrite_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace {what}; the old result stays until the new one is complete")


def parse_neurons(text: str) -> Dict[int, List[int]]:
    """``"2:17,2:101,5:40"`` -> ``{2: [17, 101], 5: [40]}``; a path to a neurons study's JSON -> its ranked
    neurons. Raises InterpError on bad syntax (the forms of :func:`interp.interventions.neuron_sets.neuron_set`)."""
    from ..interventions.neuron_sets import neuron_set

    text = (text or "").strip()
    if not text:
        raise InterpError(f"--neurons is empty: give {NEURONS_SYNTAX}")
    return neuron_set(text, label="--neurons").neurons
