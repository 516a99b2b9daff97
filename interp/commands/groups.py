"""The option groups that several ``interp`` commands hold as fields (:func:`~interp.options.group`): the model
(:class:`ModelOptions`) or the models (:class:`ModelSet`) of a run, where its images come from (:class:`Sources`),
preprocessing, ``--seed``, ``--strict`` and the output lines. A command's options class is a plain
:class:`~interp.options.Options` whose fields are its own options and these groups, in ``--help`` order::

    @dataclass(frozen=True, kw_only=True)
    class HooksOptions(Options):
        model: ModelOptions = group(ModelOptions)
        seed: SeedOption = group(SeedOption)
        pattern: Optional[str] = option(None, "only hooks matching this glob")

:class:`~interp.commands.inputs.RunInputs` reads these groups by their type. Torch-free (``interp --help``).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..console import NO_PROGRESS_ENV
from ..detection.spec import DetectionSpec
from ..errors import UsageError
from ..options import Options, group, option
from ..studies.core.options import ProbeBudget
from ..values import SEED_HELP, device_arg, image_size_arg, positive_int, seed_arg, transform_arg
from ..paths import existing_file, existing_path, weights_arg

DEVICE_HELP = "where the model runs: cpu (default), cuda, cuda:N (GPU index) or mps"
IMAGES_HELP = "image directory, list file or image (default: the bundled sample photos)"
NONE = "-"  # in a per-model list: no value for this model


def device_option() -> Any:
    """``--device`` (its own field in each group that has it, so that the group keeps its ``--help`` order)."""
    return option("cpu", DEVICE_HELP, parse=device_arg)


def batch_size_option(default: int) -> Any:
    """``--batch-size``: images per forward pass, in every command."""
    return option(default, f"images per forward pass (default {default}; lower it when memory is short)",
                  parse=positive_int)


def overwrite_option(what: str) -> Any:
    """``--overwrite``: replace ``what``."""
    return option(False, f"replace {what}; the old result stays until the new one is complete")


# ------------------------------------------------------------------------------------------ one model
@dataclass(frozen=True)
class ModelSpec:
    """One model a run builds (``MODEL`` and its options; :func:`interp.commands.common.load_model`).

    Attributes:
        label: the model's name in a table of several (``interp compare``; default its name).
    """

    name: Optional[str]
    weights: Optional[str] = None
    pretrained: bool = True
    img_size: Optional[int] = None
    depth: Optional[int] = None
    pos_resample: str = "auto"
    label: Optional[str] = None

    def named(self, default: str, error: type = UsageError) -> "ModelSpec":
        """This spec, named ``default`` when no MODEL was given (``interp report`` / ``explore``: planted_vit);
        --weights need a name (else ``error``: ``interp explore`` has always exited 1 there, ``report`` 2)."""
        if self.name is not None:
            return self
        if self.weights:
            raise error(f"--weights needs a MODEL name (the default {default} is built by construction)")
        return ModelSpec(default, None, self.pretrained, self.img_size, self.depth, self.pos_resample)


@dataclass(frozen=True, kw_only=True)
class DeviceOption(Options):
    """``--device`` alone (a command that loads no timm model: ``interp classifier zeroshot``)."""

    device: str = device_option()


@dataclass(frozen=True, kw_only=True)
class ModelOptions(Options):
    """MODEL and how it is built: --weights, --pretrained/--no-pretrained, --device, --img-size, --depth,
    --pos-resample (:meth:`spec`). ``group(ModelOptions, model=None)``: MODEL may be left out."""

    model: Optional[str] = option(None, "timm model name, e.g. vit_small_patch14_reg4_dinov2, or a transformers "
                                        "folder / hub id", positional=True, required=True)
    weights: Optional[str] = option(None, "local .safetensors/.pth/.bin state dict for MODEL, or a transformers "
                                          "folder (config.json + weights)", parse=weights_arg)
    pretrained: bool = option(True, "load hub weights (default; local HF cache when offline)", flag="--pretrained",
                              off="--no-pretrained", off_help="random weights (no download)")
    device: str = device_option()
    img_size: Optional[int] = option(None, "input size in pixels (timm img_size; resamples the position embedding)",
                                     parse=image_size_arg)
    depth: Optional[int] = option(None, "keep only the first N blocks (quick tests)", parse=positive_int)
    pos_resample: str = option(
        "auto", "how --weights' position table is resampled to --img-size: auto (default: DINOv2's own arithmetic "
                "for an original DINOv2 file, a transformers folder's own, timm's otherwise), timm, dinov2, "
                "dinov2_reg or transformers",
        choices=("auto", "timm", "dinov2", "dinov2_reg", "transformers"))

    def spec(self) -> ModelSpec:
        return ModelSpec(self.model, self.weights, self.pretrained, self.img_size, self.depth, self.pos_resample)


@dataclass(frozen=True, kw_only=True)
class DemoModelOptions(ModelOptions):
    """:class:`ModelOptions` whose MODEL may be left out: ``interp report`` and ``interp explore`` then build the
    synthetic ``planted_vit`` (:meth:`ModelSpec.named`)."""

    model: Optional[str] = option(None, "timm model name", positional=True)


# ------------------------------------------------------------------------------------------ several models
def per_model(values: Optional[Tuple[str, ...]], n_models: int, flag: str, shared: bool = True
              ) -> List[Optional[str]]:
    """One entry per model (None for ``-``) from a per-model option's values; with ``shared``, a single value
    serves all. Raises a UsageError for another count."""
    if not values:
        return [None] * n_models
    if shared and len(values) == 1 and n_models > 1 and values[0] != NONE:
        values = tuple(values) * n_models
    if len(values) != n_models:
        raise UsageError(f"{flag} takes one value per model ({n_models}), got {len(values)}; use '{NONE}' for a "
                         f"model without one, e.g. {flag} {' '.join(['X'] + [NONE] * (n_models - 1))}")
    return [None if v == NONE else v for v in values]


def checked_per_model(values: Optional[Tuple[str, ...]], n_models: int, flag: str, check, shared: bool = True
                      ) -> List[Any]:
    """:func:`per_model` with each value parsed by ``check`` (an argparse type: a file that exists, a size)."""
    try:
        return [None if v is None else check(v) for v in per_model(values, n_models, flag, shared)]
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"argument {flag}: {e}") from None


def column_labels(names: List[str], weights: List[Optional[str]], pretrained: bool,
                  sizes: Optional[List[Optional[int]]] = None) -> List[str]:
    """Column names: a name given once is the name; a name given more than once says where each one's weights
    come from (planted, random, the file, hub weights) and, where that does not tell them apart, its input
    size.

    Raises:
        UsageError: a model given twice that no column name can tell apart.
    """
    from .._model_names import PLANTED_NAMES

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


@dataclass(frozen=True, kw_only=True)
class ModelSet(Options):
    """MODEL [MODEL ...] and how each is built: per-model ``--weights`` and ``--img-size`` (one value per model in
    order, ``-`` for none; one ``--img-size`` serves all), ``--no-pretrained``, ``--device``. Checked when built
    (torch-free): the counts, the weight files, the sizes, and no model given twice with the same weights and size.
    """

    device: str = device_option()
    models: Tuple[str, ...] = option((), "timm model names (or planted_vit)", positional=True, required=True,
                                     many=True)
    weights: Optional[Tuple[str, ...]] = option(
        None, f"local weight file per model, in order; '{NONE}' for a model without one (it takes hub weights, or "
              "random ones with --no-pretrained)", many=True, metavar="FILE|-")
    pretrained: bool = option(True, "random weights for the models without a --weights file (no download)",
                              off="--no-pretrained")
    img_size: Optional[Tuple[str, ...]] = option(
        None, f"input size in pixels: one for all models, or one per model ('{NONE}': the model's own)", many=True,
        metavar="SIZE|-")

    def check(self) -> None:
        super().check()
        self.specs()

    def specs(self) -> Tuple[ModelSpec, ...]:
        """One :class:`ModelSpec` per model, each with its column label."""
        n = len(self.models)
        weights = checked_per_model(self.weights, n, "--weights", existing_file, shared=False)
        sizes = checked_per_model(self.img_size, n, "--img-size", image_size_arg)
        labels = column_labels(list(self.models), weights, self.pretrained, sizes)
        return tuple(ModelSpec(name, w, self.pretrained, size, label=label)
                     for name, w, size, label in zip(self.models, weights, sizes, labels))

    def labels(self) -> List[str]:
        """The models' column names (:func:`column_labels`)."""
        return [spec.label for spec in self.specs()]


@dataclass(frozen=True, kw_only=True)
class TableProbes(Options):
    """The linear probes of a table over models (``interp compare``, ``interp reassess``): ``--no-probes``,
    ``--probe-tokens`` and the probes' budget (:class:`~interp.studies.core.options.ProbeBudget`)."""

    probes: bool = option(True, "skip the linear probes (position / pixels / global per token group)",
                          off="--no-probes")
    probe_tokens: int = option(2000, "training tokens of each probe (seeded sample)", parse=positive_int)
    budget: ProbeBudget = group(ProbeBudget)


# ------------------------------------------------------------------------------------------ images
@dataclass(frozen=True, kw_only=True)
class Sources(Options):
    """Where a run's images (or activations) come from: ``images`` (a folder, list file or image),
    ``image_list`` (a list file), ``cache`` (an activation cache). Each command's group declares the ones it
    takes as options (:class:`Images`, ``interp cache``'s, ``interp study``'s, ``interp sae train``'s)."""

    images: Optional[str] = None
    image_list: Optional[str] = None
    cache: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Images(Sources):
    """``--images`` (optional: the command has default images)."""

    images: Optional[str] = option(None, IMAGES_HELP, parse=existing_path)


# ------------------------------------------------------------------------------------------ the run
@dataclass(frozen=True, kw_only=True)
class SeedOption(Options):
    """``--seed`` (a study's config declares its own)."""

    seed: int = option(0, SEED_HELP, parse=seed_arg)


@dataclass(frozen=True, kw_only=True)
class StrictOption(Options):
    strict: bool = option(False, "stop at the first unreadable image (default: skip it, warn, list it under "
                                 "'skipped')")


@dataclass(frozen=True, kw_only=True)
class OutputOptions(Options):
    """``--no-progress`` and ``--quiet``, the same on every command."""

    progress: bool = option(True, f"no progress bars (also: {NO_PROGRESS_ENV}=1; bars are drawn only on a "
                                  "terminal)", off="--no-progress")
    quiet: bool = option(False, "no progress bars and no info lines; warnings and errors are still shown",
                         aliases=("-q",))


@dataclass(frozen=True, kw_only=True)
class PreprocessOptions(Options):
    """``--resize N [--crop M]`` or ``--transform NAME``: a paper's eval preprocessing instead of timm's own
    (:meth:`preprocess`, checked without torch)."""

    # fields of their own names: a study may have a "crop" option of its own (segment's --no-crop)
    eval_resize: Optional[int] = option(
        None, "eval preprocessing: resize the shorter side to N px, then center-crop (--crop, default N); e.g. "
              "--resize 256 --crop 224 as Jiang et al. and DINOv2's evaluation (default: timm's own transform "
              "for the model)", flag="--resize", parse=positive_int, metavar="N")
    eval_crop: Optional[int] = option(None, "center crop M x M after --resize (the model's input size)",
                                      flag="--crop", parse=positive_int, metavar="M")
    eval_transform: Optional[str] = option(
        None, "the same by name: model (timm's own) or resizeN-cropM, e.g. resize256-crop224", flag="--transform",
        parse=transform_arg, metavar="NAME")

    def check(self) -> None:
        super().check()
        self.preprocess()

    def preprocess(self) -> Optional[str]:
        """The eval transform's name (None: timm's own): one of ``--transform`` or ``--resize``/``--crop``;
        ``--crop`` needs ``--resize`` and must fit in it."""
        from .._transforms import check_sizes

        name, resize, crop = self.eval_transform, self.eval_resize, self.eval_crop
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


# ------------------------------------------------------------------------------------------ a table over models
@dataclass(frozen=True, kw_only=True)
class ModelTable(Options):
    """How a table over several models (``interp compare``, ``interp reassess``) measures them: the models, the
    images, one detection rule, preprocessing, images per forward pass, ``--seed``, the probes, ``--strict``."""

    models: ModelSet = group(ModelSet)
    source: Images = group(Images)
    detection: DetectionSpec = group(DetectionSpec)
    preprocessing: PreprocessOptions = group(PreprocessOptions)
    batch_size: int = batch_size_option(16)
    seed: SeedOption = group(SeedOption)
    probes: TableProbes = group(TableProbes)
    strict: StrictOption = group(StrictOption)

    def settings(self, progress: bool) -> Dict[str, Any]:
        """The keywords of the engines' settings (:class:`interp.report.compare.CompareSettings`)."""
        return dict(detection=self.detection, batch_size=self.batch_size, probes=self.probes.probes,
                    probe_tokens=self.probes.probe_tokens, probe_options=self.probes.budget.probe_budget(),
                    seed=self.seed.seed, strict=self.strict.strict, preprocess=self.preprocessing.preprocess(),
                    progress=progress)
