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
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from ..options import Options, option
from ..detection.spec import DetectionSpec
from ..studies.core.options import ProbeBudget
from ..values import existing_path, image_size_arg, positive_int
from .common import check_device
from .inputs import (DeviceOption, OutputOptions, PreprocessOptions, RunInputs, SeedOption, StrictOption,
                     batch_size_option, command, overwrite_option)
from .saving import write_outputs

NONE = "-"  # in a per-model list: no value for this model


@dataclass(frozen=True, kw_only=True)
class CompareModels(DeviceOption):
    models: Tuple[str, ...] = option((), "timm model names (or planted_vit)", positional=True, required=True,
                                     many=True)
    images: Optional[str] = option(None, "image directory, list file or image (default: the bundled sample photos)",
                                   parse=existing_path)
    weights: Optional[Tuple[str, ...]] = option(
        None, f"local weight file per model, in order; '{NONE}' for a model without one (it takes hub weights, or "
              "random ones with --no-pretrained)", many=True, metavar="FILE|-")
    pretrained: bool = option(True, "random weights for the models without a --weights file (no download)",
                              off="--no-pretrained")
    img_size: Optional[Tuple[str, ...]] = option(
        None, f"input size in pixels: one for all models, or one per model ('{NONE}': the model's own)", many=True,
        metavar="SIZE|-")


@dataclass(frozen=True, kw_only=True)
class CompareProbes(Options):
    probes: bool = option(True, "skip the linear probes (position / pixels / global per token group)",
                          off="--no-probes")
    probe_tokens: int = option(2000, "training tokens of each probe (seeded sample)", parse=positive_int)


@dataclass(frozen=True, kw_only=True)
class CompareOutput(Options):
    out: Optional[str] = option(None, "write compare.json into this folder")
    overwrite: bool = overwrite_option("an existing compare.json in --out")


@dataclass(frozen=True, kw_only=True)
class CompareBatch(Options):
    batch_size: int = batch_size_option(16)


# Bases in reverse order of --help: a dataclass lists the fields of its last base first.
@dataclass(frozen=True, kw_only=True)
class CompareOptions(OutputOptions, CompareOutput, StrictOption, ProbeBudget, CompareProbes, SeedOption,
                     CompareBatch, PreprocessOptions, DetectionSpec, CompareModels):
    """The options of ``interp compare``."""


def register(sub) -> None:
    command(sub, "compare", CompareOptions, run, help="compare high-norm artifacts across models (one table)",
            description="Run the norms study on each model over the same images; print one table. Per-model options "
                        f"(--weights, --img-size) take one value per model in order, '{NONE}' for none, or one "
                        "value for all.")


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


def _check_values(options: CompareOptions) -> tuple:
    """Before torch: per-model lists of weights files (existing) and image sizes (1..MAX_IMG_SIZE: 100000 asked
    for 60 GB)."""
    from ..errors import UsageError
    from ..values import existing_file

    weights = per_model(options.weights, len(options.models), "--weights")
    sizes = per_model(options.img_size, len(options.models), "--img-size")
    for flag, values, check in (("--weights", weights, existing_file), ("--img-size", sizes, image_size_arg)):
        try:
            values[:] = [None if v is None else check(v) for v in values]
        except argparse.ArgumentTypeError as e:
            raise UsageError(f"argument {flag}: {e}") from None
    return weights, sizes


def _labels(names: List[str], weights: List[Optional[str]], pretrained: bool,
            sizes: Optional[List[Optional[int]]] = None) -> List[str]:
    """Column names: a name given once is the name; a name given more than once says where each one's weights
    come from (planted, random, the file, hub weights) and, where that does not tell them apart, its input
    size. The same model with the same weights and size given twice is refused (one line, before torch).

    Raises:
        UsageError: a model given twice that no column name can tell apart.
    """
    from .._model_names import PLANTED_NAMES
    from ..errors import UsageError

    sizes = sizes or [None] * len(names)

    def origin(name: str, w: Optional[str]) -> str:
        if w:
            return Path(w).name
        if name in PLANTED_NAMES:
            return "planted"
        return "hub weights" if pretrained else "random"

    labels = []
    for name, w, size in zip(names, weights, sizes):
        twice = names.count(name) > 1
        parts = [origin(name, w)] if w or twice else []
        if twice and size is not None and [s for n, s in zip(names, sizes) if n == name].count(size) == 1:
            parts.append(f"{size} px")
        labels.append(f"{name} ({', '.join(parts)})" if parts else name)
    for i, label in enumerate(labels):
        first = labels.index(label)
        if first != i:
            raise UsageError(f"model {names[i]!r} is given twice (positions {first + 1} and {i + 1}) with the same "
                             "weights and size: give it once, or another --weights / --img-size")
    return labels


def run(options: CompareOptions, inputs: RunInputs) -> int:
    import contextlib

    from .output import atomic_output_dir, check_output_folder

    o = options
    weights, sizes = _check_values(o)
    from ..detection.presets import resolve_preset

    resolve_preset(o.preset)  # an unknown preset is refused before torch and any model
    if o.out:
        from .saving import refuse_existing_file

        check_output_folder(o.out)
        refuse_existing_file(Path(o.out) / "compare.json", o.overwrite)
    check_device(inputs.device)
    labels = _labels(list(o.models), weights, o.pretrained, sizes)
    from ..hooks.load import load
    from ..models import sample_image_paths
    from ..report.compare import PROBE_OPTIONS, compare_models
    from ..detection.detection import DetectionSpec

    staged = atomic_output_dir(o.out, "compare.json", what="comparison") if o.out else contextlib.nullcontext()
    with staged as staging:
        models = [load(name, pretrained=o.pretrained, device=inputs.device, weights=w, seed=o.seed,
                       **({"img_size": size} if size else {}))
                  for name, w, size in zip(o.models, weights, sizes)]
        images = o.images or sample_image_paths()
        spec = DetectionSpec(threshold=o.threshold, detect_layer=o.detect_layer, preset=o.preset)
        result = compare_models(models, images, detection=spec, batch_size=o.batch_size, progress=inputs.stage_lines,
                                probes=o.probes, probe_tokens=o.probe_tokens, strict=o.strict, names=labels,
                                seed=o.seed, preprocess=o.preprocess(),
                                probe_options={**PROBE_OPTIONS, **o.probe_budget()})
        print(result.table())
        if staging is not None:
            write_outputs(result, staging)
    return 0
