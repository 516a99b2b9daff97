"""What every ``interp`` command is made of: its options, declared once as a frozen dataclass of
:func:`~interp.options.option` fields and :func:`~interp.options.group` fields holding the shared option groups
(:mod:`.groups`); the run's inputs (:class:`RunInputs`: the models, images, device, seed, progress), built once by
``interp/cli.py`` from the groups of the parsed options; and :func:`command`, which adds a command's parser. After
parsing, nothing reads the argparse Namespace: a command's function receives its options dataclass(es) and the run
inputs::

    @dataclass(frozen=True, kw_only=True)
    class HooksOptions(Options):
        model: ModelOptions = group(ModelOptions)
        seed: SeedOption = group(SeedOption)
        pattern: Optional[str] = option(None, "only hooks matching this glob")

    def run(options: HooksOptions, inputs: RunInputs) -> int: ...

    def register(sub):
        command(sub, "hooks", HooksOptions, run, help="list every hook name with its shape")

Torch-free (``interp --help`` builds every parser).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type

from ..console import progress_wanted
from ..options import Options
from .groups import (DeviceOption, ModelOptions, ModelSet, ModelSpec, OutputOptions, SeedOption, Sources,
                     StrictOption)


# ------------------------------------------------------------------------------------------ run inputs
@dataclass(frozen=True)
class RunInputs:
    """What one command run reads besides its own options, resolved once after parsing from the option groups the
    command holds (each read by its type: :class:`ModelOptions`, :class:`ModelSet`, :class:`Sources`, ...).

    Attributes:
        models: the models to build, in order (one for a MODEL command, none for a command without one).
        images: a folder, list file or image, or None; image_list: a list file or None; cache: a cache file or None.
        device: where the models run (``cpu``, ``cuda:N``, ``mps``).
        seed: the run's seed (random weights; a study's sampling), or None when the command has none.
        strict: stop at the first unreadable image.
        progress: draw progress bars (asked for, not --quiet, stderr a terminal, INTERP_NO_PROGRESS unset).
        stage_lines: show stage lines and summaries (--no-progress and --quiet not given).
        quiet: no info lines on stdout.
        argv: the command line after ``interp`` (for "continue with --resume" hints).
    """

    models: Tuple[ModelSpec, ...] = ()
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

    @property
    def model(self) -> ModelSpec:
        """The one model of a MODEL command."""
        (spec,) = self.models
        return spec

    @classmethod
    def of(cls, options: Sequence[Options], argv: Sequence[str]) -> "RunInputs":
        """The run inputs of a command's parsed ``options``: the groups they hold, read by type (the first of
        each type)."""
        found: Dict[type, Options] = {}
        for part in (p for o in options for p in o.parts()):
            for kind in (ModelOptions, ModelSet, Sources, DeviceOption, SeedOption, StrictOption, OutputOptions):
                if isinstance(part, kind):
                    found.setdefault(kind, part)
        models: Tuple[ModelSpec, ...] = ()
        device = "cpu"
        if ModelOptions in found:
            models, device = (found[ModelOptions].spec(),), found[ModelOptions].device
        elif ModelSet in found:
            models, device = found[ModelSet].specs(), found[ModelSet].device
        elif DeviceOption in found:
            device = found[DeviceOption].device
        sources = found.get(Sources, Sources())
        output = found.get(OutputOptions, OutputOptions())
        seed = found[SeedOption].seed if SeedOption in found else None
        strict = found[StrictOption].strict if StrictOption in found else False
        return cls(models=models, images=sources.images, image_list=sources.image_list, cache=sources.cache,
                   device=device, seed=seed, strict=strict, progress=progress_wanted(output.progress, output.quiet),
                   stage_lines=output.progress and not output.quiet, quiet=output.quiet, argv=tuple(argv))


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
