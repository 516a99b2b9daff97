"""``interp reassess MODEL [MODEL ...]``: the cross-architecture reassessment's claims as one table, one row
per measured figure (claims 2-5, definitions in ``interp.report.reassessment_cells.ROWS`` and docs/methods.md section
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
from typing import Dict, List, Optional, Tuple

from ..options import Options, option
from ..detection.spec import DetectionSpec
from ..studies.core.options import ProbeBudget
from ..values import top_k_arg
from .common import check_device, check_top_k
from .compare import (NONE, CompareBatch, CompareModels, CompareOutput, CompareProbes, _check_values, _labels,
                      per_model)
from .inputs import OutputOptions, PreprocessOptions, RunInputs, SeedOption, StrictOption, command


@dataclass(frozen=True, kw_only=True)
class ReassessRegisters(Options):
    """Claim 5's inputs: the classifier files, the trained-register pairs and the test-time register's neurons."""

    classifier: Optional[Tuple[str, ...]] = option(
        None, f"classifier file per model, in order ('{NONE}': the model's own head), whose class logits give claim "
              "5's accuracy (labelled images) or top-1 agreement (interp classifier)", many=True, metavar="FILE|-")
    siblings: Optional[Tuple[str, ...]] = option(
        None, "trained-register model and its no-register sibling, by position in MODEL (1-based) or name, for "
              "claim 5 (default: names that differ by _regN, e.g. vit_small_patch14_reg4_dinov2="
              "vit_small_patch14_dinov2)", many=True, metavar="REG=PLAIN")
    top_k: Optional[int] = option(None, "register neurons the test-time register edits (default: a planted model's "
                                        "own count, else 10)", parse=top_k_arg)


# Bases in reverse order of --help (as interp compare's, plus claim 5's inputs).
@dataclass(frozen=True, kw_only=True)
class ReassessOptions(OutputOptions, CompareOutput, StrictOption, ProbeBudget, CompareProbes, ReassessRegisters,
                      SeedOption, CompareBatch, PreprocessOptions, DetectionSpec, CompareModels):
    """The options of ``interp reassess``."""


HELP = {
    "models": "timm model names (or planted_vit, planted_dinov3, planted_pvt, planted_swin)",
    "images": "image directory, list file or image (default: the bundled sample photos); an image-folder layout "
              "DIR/<class>/img gives the label probe",
    "probes": "skip the linear probes (claim 4's rows say n/a)",
    "out": "write reassess.json, reassess.md and reassess.png into this folder",
    "overwrite": "replace an existing reassess.json in --out; the old result stays until the new one is complete",
}


def register(sub) -> None:
    command(sub, "reassess", ReassessOptions, run, option_help=HELP,
            help="the cross-architecture reassessment: its claims as one table over models",
            description="Measure the reassessment's claims on each model over the same images: artifact share and "
                        "norm ratio (2), redundancy of high-norm vs normal tokens (3), label / position / pixel "
                        "probes (4), attention cleanliness and behaviour with and without registers (5). Per-model "
                        f"options (--weights, --img-size, --classifier) take one value per model in order, '{NONE}' "
                        "for none, or one value for all.")


@dataclass(frozen=True)
class ReassessArgs:
    """The command line, checked before torch: per-model weights files and sizes, and the rest as given."""

    models: List[str]
    weights: List[Optional[str]]
    sizes: List[Optional[int]]
    labels: List[str]
    probe_options: dict  # the probe budget of the options (run() adds the comparison's defaults)
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

    pairs: Dict[str, str] = {}
    for value in values:
        reg, sep, plain = value.partition("=")
        if not sep:
            raise UsageError(f"argument --siblings: {value!r} is not REG=PLAIN (e.g. 2=1)")
        reg, plain = column(reg), column(plain)
        if reg == plain or {reg, plain} & (set(pairs) | set(pairs.values())):  # refused after the loads before
            raise UsageError(f"argument --siblings: {value!r} pairs a model with itself or twice; give each pair "
                             "of two models once")
        pairs[reg] = plain
    return pairs


def check_args(o: ReassessOptions, inputs: RunInputs) -> ReassessArgs:
    """Everything that can be checked before torch and any model: per-model values, the preset, the output
    folder (an existing reassess.json is refused without --overwrite), the sibling pairs, then the device (the
    one check that imports torch)."""
    from ..detection.presets import resolve_preset
    from ..errors import UsageError
    from ..values import existing_file
    from .output import check_output_folder
    from .saving import refuse_existing_file

    weights, sizes = _check_values(o)
    resolve_preset(o.preset)  # an unknown preset is refused before torch
    out = Path(o.out) if o.out else None
    if out is not None:
        check_output_folder(o.out)
        refuse_existing_file(out / "reassess.json", o.overwrite)
    labels = _labels(list(o.models), weights, o.pretrained, sizes)
    classifiers = per_model(o.classifier, len(o.models), "--classifier")
    try:
        classifiers = [None if c is None else existing_file(c) for c in classifiers]
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"argument --classifier: {e}") from None
    siblings = parse_siblings(o.siblings, labels)
    check_device(inputs.device)
    return ReassessArgs(list(o.models), weights, sizes, labels, o.probe_budget(), out, siblings, classifiers)


def run(options: ReassessOptions, inputs: RunInputs) -> int:
    import contextlib

    from .output import atomic_output_dir
    from .saving import write_outputs

    o = options
    checked = check_args(o, inputs)
    from ..detection.detection import DetectionSpec
    from ..hooks.load import load, load_skeleton
    from ..models import sample_image_paths
    from ..report.compare import PROBE_OPTIONS
    from ..report.reassessment import reassess_models
    from ..report.reassessment_figure import reassessment_figure

    for name, size in zip(checked.models, checked.sizes):  # on each model's skeleton, before any model loads
        skeleton = load_skeleton(name, **({"img_size": size} if size else {}))
        if skeleton is not None:
            check_top_k(o.top_k, skeleton)

    out = checked.out
    staged = atomic_output_dir(out, "reassess.json", replaces=["reassess.md", "reassess.png"],
                               what="reassessment") if out else contextlib.nullcontext()
    with staged as staging:
        models = [load(name, pretrained=o.pretrained, device=inputs.device, weights=w, seed=o.seed,
                       **({"img_size": size} if size else {}))
                  for name, w, size in zip(checked.models, checked.weights, checked.sizes)]
        spec = DetectionSpec(threshold=o.threshold, detect_layer=o.detect_layer, preset=o.preset)
        result = reassess_models(models, o.images or sample_image_paths(), detection=spec, names=checked.labels,
                                 batch_size=o.batch_size, probes=o.probes, probe_tokens=o.probe_tokens,
                                 probe_options={**PROBE_OPTIONS, **checked.probe_options}, top_k=o.top_k,
                                 seed=o.seed, strict=o.strict,
                                 preprocess=o.preprocess(), siblings=checked.siblings,
                                 classifiers=checked.classifiers, progress=inputs.stage_lines)
        print(result.table())
        if staging is not None:
            (Path(staging) / "reassess.md").write_text(result.table(markdown=True))
            write_outputs(result, staging, [("reassess", reassessment_figure(result))])
    return 0
