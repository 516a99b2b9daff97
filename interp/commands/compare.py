"""``interp compare MODEL [MODEL ...] --images DIR``: the norms battery, the redundancy measure and the linear
probes on several models, one table (its columns: ``interp.report.compare.COLUMN_DOCS``). The high-norm tokens
of every model follow one detection rule (``--threshold``, ``--preset``, ``--detect-layer``: a ``DetectionSpec``).

Per-model options take one value per MODEL, in order, ``-`` meaning "none" for that model; a single value
applies to every model:

    interp compare vit_small_patch16_224 vit_small_patch16_224 --weights trained.pth - --no-pretrained
    interp compare vit_small_patch14_reg4_dinov2 vit_base_patch16_224 --img-size 518 -
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional

from .common import (add_batch_size_arg, add_device_arg, add_output_args, add_overwrite_arg, add_seed_arg,
                     add_strict_arg, add_detection_args, add_preprocess_args, add_probe_budget_args, check_device,
                     preprocess_arg, probe_budget)
from .saving import write_outputs
from ..values import existing_path, positive_int, threshold_value

NONE = "-"  # in a per-model list: no value for this model


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare high-norm artifacts across models (one table)",
                       description="Run the norms study on each model over the same images; print one table. "
                                   "Per-model options (--weights, --img-size) take one value per model in order, "
                                   f"'{NONE}' for none, or one value for all.")
    p.add_argument("models", nargs="+", help="timm model names (or planted_vit)")
    p.add_argument("--images", default=None, type=existing_path,
                   help="image directory, list file or image (default: the bundled sample photos)")
    p.add_argument("--weights", nargs="+", default=None, metavar="FILE|-",
                   help=f"local weight file per model, in order; '{NONE}' for a model without one (it takes hub "
                        "weights, or random ones with --no-pretrained)")
    p.add_argument("--no-pretrained", dest="pretrained", action="store_false", default=True,
                   help="random weights for the models without a --weights file (no download)")
    p.add_argument("--img-size", nargs="+", default=None, metavar="SIZE|-",
                   help=f"input size in pixels: one for all models, or one per model ('{NONE}': the model's own)")
    add_device_arg(p)
    add_detection_args(p)
    add_preprocess_args(p)
    add_batch_size_arg(p)
    add_seed_arg(p)
    p.add_argument("--no-probes", dest="probes", action="store_false", default=True,
                   help="skip the linear probes (position / pixels / global per token group)")
    p.add_argument("--probe-tokens", type=positive_int, default=2000,
                   help="training tokens of each probe (seeded sample)")
    add_probe_budget_args(p)
    add_strict_arg(p)
    p.add_argument("--out", default=None, help="write compare.json into this folder")
    add_overwrite_arg(p, "an existing compare.json in --out")
    add_output_args(p)
    p.set_defaults(func=run)


def per_model(values: Optional[List[str]], n_models: int, flag: str) -> List[Optional[str]]:
    """One entry per model (None for ``-``) from a per-model option's values; a single value serves all."""
    from ..errors import UsageError

    if not values:
        return [None] * n_models
    if len(values) == 1 and n_models > 1 and values[0] != NONE and flag not in ("--weights", "--classifier"):
        values = values * n_models
    if len(values) != n_models:
        raise UsageError(f"{flag} takes one value per model ({n_models}), got {len(values)}; "
                         f"use '{NONE}' for a model without one, e.g. {flag} {' '.join(['X'] + [NONE] * (n_models - 1))}")
    return [None if v == NONE else v for v in values]


def _check_values(args) -> tuple:
    """Before torch: per-model lists of weights files (existing) and image sizes (positive integers)."""
    from ..errors import UsageError
    from ..values import existing_file

    weights = per_model(args.weights, len(args.models), "--weights")
    sizes = per_model(args.img_size, len(args.models), "--img-size")
    for flag, values, check in (("--weights", weights, existing_file), ("--img-size", sizes, positive_int)):
        try:
            values[:] = [None if v is None else check(v) for v in values]
        except argparse.ArgumentTypeError as e:
            raise UsageError(f"argument {flag}: {e}") from None
    return weights, sizes


def _labels(names: List[str], weights: List[Optional[str]], pretrained: bool) -> List[str]:
    """Row names: a model with a weights file is named with it; a name given twice says which is which."""
    labels = []
    for name, w in zip(names, weights):
        if w:
            labels.append(f"{name} ({Path(w).name})")
        elif names.count(name) > 1:
            labels.append(f"{name} ({'hub weights' if pretrained else 'random'})")
        else:
            labels.append(name)
    return labels


def run(args: argparse.Namespace) -> int:
    import contextlib

    from .output import atomic_output_dir, check_output_folder

    weights, sizes = _check_values(args)
    preprocess = preprocess_arg(args)
    budget = probe_budget(args)
    from ..detection.presets import resolve_preset

    resolve_preset(args.preset)  # an unknown preset is refused before torch and any model
    if args.out:
        from .saving import refuse_existing_file

        check_output_folder(args.out)
        refuse_existing_file(Path(args.out) / "compare.json", args.overwrite)
    check_device(args.device)
    from ..hooks.load import load
    from ..models import sample_image_paths
    from ..report.compare import PROBE_OPTIONS, compare_models
    from ..detection.detection import DetectionSpec

    staged = atomic_output_dir(args.out, "compare.json", what="comparison") if args.out else contextlib.nullcontext()
    with staged as staging:
        models = [load(name, pretrained=args.pretrained, device=args.device, weights=w, seed=args.seed,
                       **({"img_size": size} if size else {}))
                  for name, w, size in zip(args.models, weights, sizes)]
        labels = _labels(args.models, weights, args.pretrained)
        images = args.images or sample_image_paths()
        spec = DetectionSpec(threshold_value(args.threshold), args.detect_layer, args.preset)
        result = compare_models(models, images, detection=spec, batch_size=args.batch_size, progress=args.progress,
                                probes=args.probes, probe_tokens=args.probe_tokens, strict=args.strict, names=labels,
                                seed=args.seed, preprocess=preprocess, probe_options={**PROBE_OPTIONS, **budget})
        print(result.table())
        if staging is not None:
            write_outputs(result, staging)
    return 0
