"""The table of ``interp study NAME`` commands, derived from the studies' descriptors
(:data:`interp.studies.core.descriptors.DESCRIPTORS`: name, help, hooks read from a cache, live-only or not); a row
adds only where its arguments and its run live on the command line.

Adding a study to the command line: its descriptor in ``interp/studies/core/descriptors.py``, then
``interp/commands/study_<x>.py`` with ``add_<x>_arguments(parser)`` and ``run_<x>(args) -> int`` and a row below.

Nothing here imports torch: the parsers are built from this table without loading a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from ..errors import InterpError
from ..studies.core.descriptors import DESCRIPTORS, StudyDescriptor, descriptor
from ..studies.core.descriptors import required_hooks  # noqa: F401  (the name Python users and tests know)

@dataclass(frozen=True)
class StudyCommand:
    """One ``interp study NAME``: the study's descriptor plus where its command-line pieces live.

    Attributes:
        descriptor: the study (name, help, hooks read from a cache, live-only, JSON name).
        module: module under ``interp.commands`` with the two functions below.
        add_arguments: name of ``(argparse parser) -> None`` in ``module`` (sets the parser's description too).
        run: name of ``(args) -> int`` in ``module``.
    """

    descriptor: StudyDescriptor
    module: str
    add_arguments: str
    run: str

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


def _command(name: str, module: str) -> StudyCommand:
    stem = name.replace("-", "_")
    return StudyCommand(DESCRIPTORS[name], module, f"add_{stem}_arguments", f"run_{stem}")


# study -> the commands module of its theme (the themes of interp/studies/; probes share study_objects)
_A, _L, _O = "study_artifacts", "study_aggregation", "study_objects"
_MODULES = {"norms": _A, "neurons": _A, "ablate": _A, "relocate": _A, "registers": _A, "redundancy": _A,
            "patch-score": _L,
            "pib": _L, "masking": _L, "selective-cls": _L, "probes": _O, "lost": _O, "segment": _O}
STUDIES: Dict[str, StudyCommand] = {name: _command(name, _MODULES[name]) for name in DESCRIPTORS}


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

