"""The table of ``interp study NAME`` commands, derived from the studies' descriptors
(:data:`interp.studies.core.descriptors.DESCRIPTORS`: name, study function, help, hooks read from a cache,
live-only or not); a row adds only the two command-line functions of the study.

Dispatch goes through the descriptor: ``interp study NAME`` calls ``run(args, study)`` with the study function
the descriptor names (imported when the command runs), so no command imports or names its study itself.

Adding a study to the command line: its descriptor in ``interp/studies/core/descriptors.py``, then
``add_<x>_arguments(parser)`` and ``run_<x>(args, <x>_study) -> int`` in ``interp/commands/study_<theme>.py``
and its row in :data:`_COMMANDS` below.

Nothing here imports torch: the parsers are built from this table without loading a model.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping

from ..errors import InterpError
from ..studies.core.descriptors import DESCRIPTORS, StudyDescriptor, descriptor
from ..studies.core.descriptors import required_hooks  # noqa: F401  (the name Python users and tests know)
from . import study_aggregation as _L, study_artifacts as _A, study_objects as _O


@dataclass(frozen=True)
class StudyCommand:
    """One ``interp study NAME``: the study's descriptor plus its two command-line functions.

    Attributes:
        descriptor: the study (name, function, help, hooks read from a cache, live-only, JSON name).
        add_arguments: ``(argparse parser) -> None`` (sets the parser's description too).
        run: ``(args, study function) -> exit code``; :meth:`__call__` passes the descriptor's function.
    """

    descriptor: StudyDescriptor
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Callable], int]

    def __call__(self, args: argparse.Namespace) -> int:
        """Run the command on parsed ``args`` with the study function its descriptor names."""
        return self.run(args, self.descriptor.study_function())

    @property
    def name(self) -> str:
        return self.descriptor.name

    @property
    def help(self) -> str:
        return self.descriptor.summary

    @property
    def hooks(self):
        """``(n_layers, options) -> [hook names]`` it reads from a cache; None for a study that re-runs the model."""
        return self.descriptor.hooks

    @property
    def full_vectors(self) -> bool:
        return self.descriptor.full_vectors

    @property
    def result_name(self) -> str:
        """Stem of the JSON file the study writes (``patch_score`` for ``patch-score``)."""
        return self.descriptor.json_name


# study -> (add_arguments, run), from the commands module of its theme (the themes of interp/studies/)
_COMMANDS = {
    "norms": (_A.add_norms_arguments, _A.run_norms), "neurons": (_A.add_neurons_arguments, _A.run_neurons),
    "ablate": (_A.add_ablate_arguments, _A.run_ablate), "relocate": (_A.add_relocate_arguments, _A.run_relocate),
    "registers": (_A.add_registers_arguments, _A.run_registers),
    "redundancy": (_A.add_redundancy_arguments, _A.run_redundancy),
    "patch-score": (_L.add_patch_score_arguments, _L.run_patch_score), "pib": (_L.add_pib_arguments, _L.run_pib),
    "masking": (_L.add_masking_arguments, _L.run_masking),
    "selective-cls": (_L.add_selective_cls_arguments, _L.run_selective_cls),
    "probes": (_O.add_probes_arguments, _O.run_probes), "lost": (_O.add_lost_arguments, _O.run_lost),
    "segment": (_O.add_segment_arguments, _O.run_segment),
}
STUDIES: Dict[str, StudyCommand] = {name: StudyCommand(DESCRIPTORS[name], *_COMMANDS[name]) for name in DESCRIPTORS}


def study_command(name: str) -> StudyCommand:
    """The table row of ``name``; an error listing the known studies otherwise."""
    descriptor(name)  # the error for an unknown name
    return STUDIES[name]


def hooks_for_studies(studies: str, n_layers: int) -> List[str]:
    """The union (in order) of the hooks the comma-separated ``studies`` need with their default options."""
    names = [s.strip() for s in studies.split(",") if s.strip()]
    if not names:
        raise InterpError("--for needs study names, e.g. --for norms,neurons")
    hooks: List[str] = []
    for name in names:
        hooks += required_hooks(name, n_layers)
    return list(dict.fromkeys(hooks))


def check_cache_serves(source, study: str, n_layers: int, options: Mapping) -> None:
    """Before any work: raise unless the cache ``source`` holds every hook ``study`` reads on a model with
    ``n_layers`` blocks (in full when it needs vectors), naming the missing hooks and the ``interp cache --for``
    command that writes them."""
    command = study_command(study)
    hooks = required_hooks(study, n_layers, options)
    missing = [h for h in hooks if not source.has(h)]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise InterpError(f"the cache lacks hooks that interp study {study} reads: {shown}; write one with "
                          f"`interp cache MODEL --images DIR --for {study} --out FILE.h5` or run on --images")
    if command.full_vectors and source.norms_only:
        raise InterpError(f"the cache stores token norms only (--norms-only); interp study {study} needs the "
                          "activations: write the cache without --norms-only")

