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

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import InterpError
from ..options import Options, group, option
from ..studies.catalog import declared, study_function
from ..studies.declaration import StudyConfig
from ..paths import existing_file, existing_path
from .common import load_model
from .groups import (ModelOptions, OutputOptions, PreprocessOptions, Sources, StrictOption, batch_size_option,
                     overwrite_option)
from .inputs import Command, RunInputs, command

IMAGES_HELP = "image directory (DIR/<class>/img gives labels), list file or image"
CACHE_HELP = "an interp cache file (.h5) to read activations from"


@dataclass(frozen=True, kw_only=True)
class StudySources(Sources):
    """``--images`` or ``--cache`` (one of them)."""

    REQUIRED_GROUPS = ("source",)

    images: Any = option(None, IMAGES_HELP, parse=existing_path, exclusive="source")
    cache: Optional[str] = option(None, CACHE_HELP, parse=existing_file, exclusive="source")


@dataclass(frozen=True, kw_only=True)
class LiveSources(Sources):
    """``--images`` (a study that re-runs the model)."""

    REQUIRED_GROUPS = ("source",)

    images: Any = option(None, IMAGES_HELP, parse=existing_path, exclusive="source")


@dataclass(frozen=True, kw_only=True)
class ImagesAndCacheSources(Sources):
    """``--images`` and ``--cache`` (a ``--cache`` run that takes ``--images`` too: the config's
    ``cache_images_help`` says what for)."""

    images: Any = option(None, IMAGES_HELP, parse=existing_path)
    cache: Optional[str] = option(None, CACHE_HELP, parse=existing_file)


@dataclass(frozen=True, kw_only=True)
class StudyRun(Options):
    """What one ``interp study`` run reads and where it writes, the same for every study (the study's own options
    are its config): the model, ``--images`` / ``--cache`` (one of them), ``--out``, preprocessing, images per
    forward pass, ``--strict``, ``--overwrite``, progress."""

    model: ModelOptions = group(ModelOptions)
    source: Sources = group(StudySources)
    out: str = option(None, "output directory for <study>.json and PNGs", required=True)
    preprocessing: PreprocessOptions = group(PreprocessOptions)
    batch_size: int = batch_size_option(16)
    strict: StrictOption = group(StrictOption)
    overwrite: bool = overwrite_option("an existing <study>.json in --out (and the figures it lists)")
    output: OutputOptions = group(OutputOptions)


@dataclass(frozen=True, kw_only=True)
class LiveStudyRun(StudyRun):
    """A study that re-runs the model: ``--images`` only."""

    source: Sources = group(LiveSources)


@dataclass(frozen=True, kw_only=True)
class ImagesAndCacheStudyRun(StudyRun):
    """A study whose ``--cache`` run takes ``--images`` too."""

    source: Sources = group(ImagesAndCacheSources)


RUN_OPTIONS = {"images": LiveStudyRun, "images_or_cache": StudyRun, "images_and_cache": ImagesAndCacheStudyRun}


def open_study_source(options: StudyRun, model, config: StudyConfig):
    """The activation source of a run: live over the images the config asks for, or the cache (checked up front
    against the hooks the config reads, so a cache that cannot serve the study fails before any work)."""
    from ..runtime.open import open_source

    given = options.source
    images = None if given.cache else config.source_images(given.images)
    source = open_source(model=model, images=images, cache=given.cache, batch_size=options.batch_size,
                         strict=options.strict.strict, preprocess=options.preprocessing.preprocess())
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


def run_study(options: StudyRun, config: StudyConfig, inputs: RunInputs) -> int:
    """One ``interp study NAME`` run (see the module docstring)."""
    from .output import atomic_output_dir
    from .saving import prepare_study_output, save_study

    images, cache = options.source.images, options.source.cache
    config.check_inputs(images, cache)
    name = config.json_name()
    old_figures = prepare_study_output(options.out, name, options.overwrite)
    with atomic_output_dir(options.out, f"{name}.json", replaces=old_figures, what=f"{name} result") as staging:
        model = load_model(dataclasses.replace(inputs, seed=config.seed), (options, config))  # the study's seed
        source = open_study_source(options, model, config)
        result = study_function(type(config))(source, config, progress=inputs.stage_lines,
                                              **config.run_keywords(images, cache))
        for line in result.console_lines(config):
            print(line)
        save_study(result, staging, source, model, **config.to_dict())
    return 0


def register(sub) -> None:
    p = sub.add_parser("study", help="run one study (norms, neurons, ablate, relocate, patch-score, pib, ...)",
                       description="Run one study on a model over images (or a cache) and write JSON + PNGs.")
    studies = p.add_subparsers(dest="study", metavar="NAME")
    for name, config in declared().items():
        # with --cache, the --images help says what the images add to the run
        shown = {"images": f"{IMAGES_HELP}; with --cache: {config.cache_images_help}"} \
            if config.inputs == "images_and_cache" else None
        command(studies, name, (RUN_OPTIONS[config.inputs], config), run_study, option_help=shown,
                help=config.summary(), description=config.description())
    p.set_defaults(func=Command((), lambda inputs: (p.print_help(), 2)[1]))
