"""``interp reassess MODEL [MODEL ...]``: the cross-architecture reassessment's claims as one table, one row
per measured figure (claims 2-5, definitions in ``interp.report.reassessment.ROWS`` and docs/methods.md section
6), one column per model; writes ``reassess.json``, ``reassess.md`` and ``reassess.png`` with ``--out``.

Per-model options take one value per MODEL, in order, ``-`` meaning "none" for that model; a single value
applies to every model (as ``interp compare``):

    interp reassess vit_small_patch14_dinov2 vit_small_patch14_reg4_dinov2 --img-size 224 --images photos/
    interp reassess planted_vit planted_pvt --out out/reassess
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from .common import (add_batch_size_arg, add_device_arg, add_output_args, add_overwrite_arg, add_seed_arg,
                     add_strict_arg, add_detection_args, add_preprocess_args, add_probe_budget_args, check_device,
                     preprocess_arg, probe_budget)
from .compare import NONE, _check_values, _labels, per_model
from ..values import existing_path, positive_int, threshold_value


def register(sub) -> None:
    p = sub.add_parser("reassess", help="the cross-architecture reassessment: its claims as one table over models",
                       description="Measure the reassessment's claims on each model over the same images: artifact "
                                   "share and norm ratio (2), redundancy of high-norm vs normal tokens (3), label / "
                                   "position / pixel probes (4), attention cleanliness and behaviour with and "
                                   "without registers (5). Per-model options (--weights, --img-size) take one "
                                   f"value per model in order, '{NONE}' for none, or one value for all.")
    p.add_argument("models", nargs="+",
                   help="timm model names (or planted_vit, planted_dinov3, planted_pvt, planted_swin)")
    p.add_argument("--images", default=None, type=existing_path,
                   help="image directory, list file or image (default: the bundled sample photos); an image-folder "
                        "layout DIR/<class>/img gives the label probe")
    p.add_argument("--weights", nargs="+", default=None, metavar="FILE|-",
                   help=f"local weight file per model, in order; '{NONE}' for a model without one")
    p.add_argument("--classifier", nargs="+", default=None, metavar="FILE|-",
                   help=f"classifier file per model, in order ('{NONE}': the model's own head), whose class logits "
                        "give claim 5's accuracy (labelled images) or top-1 agreement (interp classifier)")
    p.add_argument("--no-pretrained", dest="pretrained", action="store_false", default=True,
                   help="random weights for the models without a --weights file (no download)")
    p.add_argument("--img-size", nargs="+", default=None, metavar="SIZE|-",
                   help=f"input size in pixels: one for all models, or one per model ('{NONE}': the model's own)")
    add_device_arg(p)
    add_detection_args(p)
    add_preprocess_args(p)
    add_batch_size_arg(p)
    add_seed_arg(p)
    p.add_argument("--siblings", nargs="+", default=None, metavar="REG=PLAIN",
                   help="trained-register model and its no-register sibling, by position in MODEL (1-based) or "
                        "name, for claim 5 (default: names that differ by _regN, e.g. vit_small_patch14_reg4_dinov2="
                        "vit_small_patch14_dinov2)")
    p.add_argument("--top-k", type=positive_int, default=None,
                   help="register neurons the test-time register edits (default: a planted model's own count, "
                        "else 10)")
    p.add_argument("--no-probes", dest="probes", action="store_false", default=True,
                   help="skip the linear probes (claim 4's rows say n/a)")
    p.add_argument("--probe-tokens", type=positive_int, default=2000,
                   help="training tokens of each probe (seeded sample)")
    add_probe_budget_args(p)
    add_strict_arg(p)
    p.add_argument("--out", default=None, help="write reassess.json, reassess.md and reassess.png into this folder")
    add_overwrite_arg(p, "an existing reassess.json in --out")
    add_output_args(p)
    p.set_defaults(func=run)


@dataclass(frozen=True)
class ReassessArgs:
    """The command line, checked before torch: per-model weights files and sizes, and the rest as given."""

    models: List[str]
    weights: List[Optional[str]]
    sizes: List[Optional[int]]
    labels: List[str]
    preprocess: object
    probe_options: dict
    out: Optional[Path]
    siblings: Optional[Dict[str, str]]
    classifiers: List[Optional[str]]


def parse_siblings(values: Optional[List[str]], labels: List[str]) -> Optional[Dict[str, str]]:
    """``REG=PLAIN`` pairs (each a 1-based position in MODEL or a column name) -> {column: column}."""
    from ..errors import UsageError

    if values is None:
        return None

    def column(text: str) -> str:
        if text.isdigit() and 1 <= int(text) <= len(labels):
            return labels[int(text) - 1]
        if text in labels:
            return text
        raise UsageError(f"argument --siblings: {text!r} is neither a model nor a position 1..{len(labels)}")

    pairs = {}
    for value in values:
        reg, sep, plain = value.partition("=")
        if not sep:
            raise UsageError(f"argument --siblings: {value!r} is not REG=PLAIN (e.g. 2=1)")
        pairs[column(reg)] = column(plain)
    return pairs


def check_args(args: argparse.Namespace) -> ReassessArgs:
    """Everything that can be checked before torch and any model: per-model values, the preset, the output
    folder (an existing reassess.json is refused without --overwrite) and the device."""
    from ..detection.presets import resolve_preset
    from ..errors import UsageError
    from ..report.compare import PROBE_OPTIONS
    from ..values import existing_file
    from .output import check_output_folder
    from .saving import refuse_existing_file

    weights, sizes = _check_values(args)
    preprocess = preprocess_arg(args)
    budget = probe_budget(args)
    resolve_preset(args.preset)  # an unknown preset is refused before torch
    out = Path(args.out) if args.out else None
    if out is not None:
        check_output_folder(args.out)
        refuse_existing_file(out / "reassess.json", args.overwrite)
    check_device(args.device)
    labels = _labels(args.models, weights, args.pretrained)
    classifiers = per_model(args.classifier, len(args.models), "--classifier")
    try:
        classifiers = [None if c is None else existing_file(c) for c in classifiers]
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"argument --classifier: {e}") from None
    return ReassessArgs(list(args.models), weights, sizes, labels, preprocess, {**PROBE_OPTIONS, **budget}, out,
                        parse_siblings(args.siblings, labels), classifiers)


def run(args: argparse.Namespace) -> int:
    import contextlib

    from .output import atomic_output_dir
    from .saving import write_outputs

    checked = check_args(args)
    from ..detection.detection import DetectionSpec
    from ..hooks.load import load
    from ..models import sample_image_paths
    from ..report.reassessment import reassess_models
    from ..report.reassessment_figure import reassessment_figure

    out = checked.out
    staged = atomic_output_dir(out, "reassess.json", replaces=["reassess.md", "reassess.png"],
                               what="reassessment") if out else contextlib.nullcontext()
    with staged as staging:
        models = [load(name, pretrained=args.pretrained, device=args.device, weights=w, seed=args.seed,
                       **({"img_size": size} if size else {}))
                  for name, w, size in zip(checked.models, checked.weights, checked.sizes)]
        spec = DetectionSpec(threshold_value(args.threshold), args.detect_layer, args.preset)
        result = reassess_models(models, args.images or sample_image_paths(), detection=spec, names=checked.labels,
                                 batch_size=args.batch_size, probes=args.probes, probe_tokens=args.probe_tokens,
                                 probe_options=checked.probe_options, top_k=args.top_k, seed=args.seed,
                                 strict=args.strict, preprocess=checked.preprocess, siblings=checked.siblings,
                                 classifiers=checked.classifiers, progress=args.progress)
        print(result.table())
        if staging is not None:
            (Path(staging) / "reassess.md").write_text(result.table(markdown=True))
            write_outputs(result, staging, [("reassess", reassessment_figure(result))])
    return 0
