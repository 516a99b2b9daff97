"""``interp study NAME MODEL ...``: run one study and write its JSON result and figures.

Every ``interp study NAME`` is generated from the study's declaration (:mod:`interp.studies.declaration`): the
run's inputs (model, ``--images`` / ``--cache``, ``--out``, preprocessing, batch size) are the same for every
study; the study's own options come from its config dataclass. One run:

1. the config is built from the command line and checked (torch-free), the output folder checked;
2. the model is loaded and the activation source opened (a cache is checked against the hooks the config reads);
3. the study function bound to the config runs; the result's console lines are printed;
4. ``<study>.json`` and its figures are written into a staging folder that replaces the old result only once
   complete (:func:`interp.commands.output.atomic_output_dir`, which also locks the result against a second run).
"""
from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from typing import Any, Optional, Type

from ..errors import InterpError
from ..studies.catalog import declared, study_function
from ..studies.declaration import StudyConfig
from .common import add_study_args, model_from_args, preprocess_arg


@dataclass(frozen=True)
class StudyInputs:
    """What one ``interp study`` run reads and where it writes (the study's own options are its config).

    Attributes:
        images: ``--images`` (a folder, list file or image; a list of paths when a study widens it) or None.
        cache: ``--cache`` file or None.
        out: ``--out`` folder.
        batch_size: images per forward pass.
        strict: stop at the first unreadable image.
        preprocess: the eval transform's name (``--transform`` / ``--resize`` / ``--crop``) or None (timm's own).
        overwrite: replace an existing result.
        progress: show progress bars.
    """

    images: Any
    cache: Optional[str]
    out: str
    batch_size: int
    strict: bool
    preprocess: Optional[str]
    overwrite: bool
    progress: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "StudyInputs":
        return cls(images=args.images, cache=args.cache, out=args.out, batch_size=args.batch_size,
                   strict=args.strict, preprocess=preprocess_arg(args), overwrite=args.overwrite,
                   progress=args.progress)


def open_study_source(inputs: StudyInputs, model, config: StudyConfig):
    """The activation source of a run: live over the images the config asks for, or the cache (checked up front
    against the hooks the config reads, so a cache that cannot serve the study fails before any work)."""
    from ..runtime.open import open_source

    images = None if inputs.cache else config.source_images(inputs.images)
    source = open_source(model=model, images=images, cache=inputs.cache, batch_size=inputs.batch_size,
                         strict=inputs.strict, preprocess=inputs.preprocess)
    if not source.is_live:
        check_cache_serves(source, config, model.block_names)
    return source


def check_cache_serves(source, config: StudyConfig, blocks) -> None:
    """Raise unless the cache ``source`` holds every hook ``config`` reads (in full when it needs vectors),
    naming the missing hooks and the ``interp cache --for`` command that writes them."""
    missing = [h for h in config.required_hooks(blocks) if not source.has(h)]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise InterpError(f"the cache lacks hooks that interp study {config.name} reads: {shown}; write one with "
                          f"`interp cache MODEL --images DIR --for {config.name} --out FILE.h5` or run on --images")
    if config.full_vectors and source.norms_only:
        raise InterpError(f"the cache stores token norms only (--norms-only); interp study {config.name} needs "
                          "the activations: write the cache without --norms-only")


def run_study(config_class: Type[StudyConfig], args: argparse.Namespace) -> int:
    """One ``interp study NAME`` run (see the module docstring)."""
    from .output import atomic_output_dir
    from .saving import prepare_study_output, save_study

    config = config_class.from_args(args)
    inputs = StudyInputs.from_args(args)
    config.check_inputs(inputs.images, inputs.cache)
    name = config.json_name()
    old_figures = prepare_study_output(inputs.out, name, inputs.overwrite)
    with atomic_output_dir(inputs.out, f"{name}.json", replaces=old_figures, what=f"{name} result") as staging:
        model = model_from_args(args)
        source = open_study_source(inputs, model, config)
        result = study_function(config_class)(source, config, progress=inputs.progress,
                                              **config.run_keywords(inputs.images, inputs.cache))
        for line in result.console_lines(config):
            print(line)
        save_study(result, staging, source, model, **config.to_dict())
    return 0


def register(sub) -> None:
    p = sub.add_parser("study", help="run one study (norms, neurons, ablate, relocate, patch-score, pib, ...)",
                       description="Run one study on a model over images (or a cache) and write JSON + PNGs.")
    studies = p.add_subparsers(dest="study", metavar="NAME")
    for name, config in declared().items():
        parser = studies.add_parser(name, help=config.summary(), description=config.description())
        add_study_args(parser, config.inputs, config.cache_images_help)
        config.add_arguments(parser)
        parser.set_defaults(func=functools.partial(run_study, config))
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
