"""What every ``interp`` command is made of: its options, declared once as a frozen dataclass of
:func:`~interp.options.option` fields composed from the option groups below; the run's inputs
(:class:`RunInputs`: model, images, device, seed, progress), built once by ``interp/cli.py`` from the parsed
options; and :func:`command`, which adds a command's parser. After parsing, nothing reads the argparse
Namespace: a command's function receives its options dataclass(es) and the run inputs::

    @dataclass(frozen=True, kw_only=True)
    class HooksOptions(ModelOptions, SeedOption):
        pattern: Optional[str] = option(None, "only hooks matching this glob")

    def run(options: HooksOptions, inputs: RunInputs) -> int: ...

    def register(sub):
        command(sub, "hooks", HooksOptions, run, help="list every hook name with its shape")

Torch-free (``interp --help`` builds every parser).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type

from ..console import NO_PROGRESS_ENV, progress_wanted
from ..errors import UsageError
from ..options import Options, option
from ..values import (SEED_HELP, device_arg, existing_file, image_size_arg, positive_int, seed_arg,
                      transform_arg, weights_arg)

# ------------------------------------------------------------------------------------------ option groups
DEVICE_HELP = "where the model runs: cpu (default), cuda, cuda:N (GPU index) or mps"


def device_option() -> Any:
    """``--device`` (its own field in each group that has it, so that the group keeps its ``--help`` order)."""
    return option("cpu", DEVICE_HELP, parse=device_arg)


@dataclass(frozen=True, kw_only=True)
class ModelOptions(Options):
    """MODEL and how it is built: --weights, --pretrained/--no-pretrained, --device, --img-size, --depth,
    --pos-resample (:class:`ModelSpec`)."""

    model: Optional[str] = option(None, "timm model name, e.g. vit_small_patch14_reg4_dinov2, or a transformers "
                                        "folder / hub id", positional=True,
                                  required=True)
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
                "for an original DINOv2 file, timm's otherwise), timm, dinov2 or dinov2_reg",
        choices=("auto", "timm", "dinov2", "dinov2_reg"))


@dataclass(frozen=True, kw_only=True)
class DeviceOption(Options):
    """``--device`` alone (commands that build their models themselves)."""

    device: str = device_option()


@dataclass(frozen=True, kw_only=True)
class SeedOption(Options):
    """``--seed`` (a study's config declares its own)."""

    seed: int = option(0, SEED_HELP, parse=seed_arg)


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


def batch_size_option(default: int) -> Any:
    """``--batch-size``: images per forward pass, in every command."""
    return option(default, f"images per forward pass (default {default}; lower it when memory is short)",
                  parse=positive_int)


@dataclass(frozen=True, kw_only=True)
class StrictOption(Options):
    strict: bool = option(False, "stop at the first unreadable image (default: skip it, warn, list it under "
                                 "'skipped')")


def overwrite_option(what: str) -> Any:
    """``--overwrite``: replace ``what``."""
    return option(False, f"replace {what}; the old result stays until the new one is complete")


@dataclass(frozen=True, kw_only=True)
class OutputOptions(Options):
    """``--no-progress`` and ``--quiet``, the same on every command."""

    progress: bool = option(True, f"no progress bars (also: {NO_PROGRESS_ENV}=1; bars are drawn only on a "
                                  "terminal)", off="--no-progress")
    quiet: bool = option(False, "no progress bars and no info lines; warnings and errors are still shown",
                         aliases=("-q",))


# ------------------------------------------------------------------------------------------ run inputs
def option_value(options: Sequence[Options], name: str, default: Any = None) -> Any:
    """The value of the option ``name`` in the first of a command's options objects that declares it (itself or
    in an option group it holds, :func:`~interp.options.group`), else ``default`` (the checks shared by several
    commands: block numbers, ``--hook``, ``--sae``)."""
    for o in options:
        own = {f.name: f for f in fields(o)}
        if name in own and "group" not in own[name].metadata:
            return getattr(o, name)
        for f in own.values():
            held = getattr(o, f.name) if "group" in f.metadata else None
            if held is not None and name in {g.name for g in fields(held)}:
                return getattr(held, name)
    return default


@dataclass(frozen=True)
class ModelSpec:
    """The model a run builds (``MODEL`` and its options; :func:`interp.commands.common.load_model`)."""

    name: Optional[str]
    weights: Optional[str] = None
    pretrained: bool = True
    img_size: Optional[int] = None
    depth: Optional[int] = None
    pos_resample: str = "auto"

    def named(self, default: str, error: type = UsageError) -> "ModelSpec":
        """This spec, named ``default`` when no MODEL was given (``interp report`` / ``explore``: planted_vit);
        --weights need a name (else ``error``: ``interp explore`` has always exited 1 there, ``report`` 2)."""
        if self.name is not None:
            return self
        if self.weights:
            raise error(f"--weights needs a MODEL name (the default {default} is built by construction)")
        return ModelSpec(default, None, self.pretrained, self.img_size, self.depth, self.pos_resample)


@dataclass(frozen=True)
class RunInputs:
    """What one command run reads besides its own options, resolved once after parsing.

    Attributes:
        model: the model to build (None: the command takes no MODEL, or several: ``interp compare``).
        images: ``--images`` (a folder, list file or image) or None; image_list: ``--image-list`` or None.
        cache: ``--cache`` file or None.
        device: where the model runs (``cpu``, ``cuda:N``, ``mps``).
        seed: the run's seed (random weights; a study's sampling), or None when the command has none.
        strict: stop at the first unreadable image.
        progress: draw progress bars (asked for, not --quiet, stderr a terminal, INTERP_NO_PROGRESS unset).
        stage_lines: show stage lines and summaries (--no-progress and --quiet not given).
        quiet: no info lines on stdout.
        argv: the command line after ``interp`` (for "continue with --resume" hints).
    """

    model: Optional[ModelSpec] = None
    images: Any = None
    image_list: Optional[str] = None
    cache: Optional[str] = None
    device: str = "cpu"
    seed: Optional[int] = None
    strict: bool = False
    progress: bool = False
    stage_lines: bool = True
    quiet: bool = False
    argv: Tuple[str, ...] = ()

    @classmethod
    def of(cls, options: Sequence[Options], argv: Sequence[str]) -> "RunInputs":
        """The run inputs of a command's parsed ``options`` (each field from the first options object that
        declares it)."""
        def given(name: str, default: Any = None) -> Any:
            return option_value(options, name, default)

        model = None
        if any(isinstance(o, ModelOptions) for o in options):
            model = ModelSpec(given("model"), given("weights"), given("pretrained", True), given("img_size"),
                              given("depth"), given("pos_resample", "auto"))
        quiet = bool(given("quiet", False))
        asked = bool(given("progress", True))
        return cls(model=model, images=given("images"), image_list=given("image_list"), cache=given("cache"),
                   device=given("device", "cpu"), seed=given("seed"), strict=bool(given("strict", False)),
                   progress=progress_wanted(asked, quiet), stage_lines=asked and not quiet, quiet=quiet,
                   argv=tuple(argv))


# ------------------------------------------------------------------------------------------ commands
@dataclass(frozen=True)
class Command:
    """A command's declaration as its parser keeps it: its options classes and its function
    ``run(*options, inputs) -> exit status``."""

    options: Tuple[Type[Options], ...]
    run: Callable[..., int]

    def parse(self, args: argparse.Namespace) -> Tuple[Options, ...]:
        """The options objects of the parsed ``args`` (checked: a bad combination is a UsageError)."""
        return tuple(o.from_args(args) for o in self.options)

    def __call__(self, *values: Any) -> int:
        return self.run(*values)


def command(sub, name: str, options: Any, run: Callable[..., int], *,
            option_help: Optional[Dict[str, str]] = None, **parser: Any) -> argparse.ArgumentParser:
    """Add the sub-command ``name`` to ``sub`` (argparse's sub-parsers): one argument per declared field of
    ``options`` (an Options class, or several), ``run`` called with the parsed options and the
    :class:`RunInputs`; ``option_help``: other help texts by field name; ``parser``: ``help``,
    ``description``, ``epilog``."""
    classes = tuple(options) if isinstance(options, (tuple, list)) else (options,)
    p = sub.add_parser(name, **parser)
    for cls in classes:
        cls.add_arguments(p, help=option_help)
    p.set_defaults(func=Command(classes, run))
    return p
