"""``interp study NAME MODEL ...``: run one study and write its JSON result and figures.

Each study's arguments live in ``interp/commands/study_<group>.py``, a module with ``register(subparsers)``.
"""
from __future__ import annotations

import importlib
import importlib.util

STUDY_GROUPS = ("study_artifacts", "study_lazy")


def register(sub) -> None:
    p = sub.add_parser("study", help="run one study (norms, neurons, ablate, relocate, patch-score, pib, ...)",
                       description="Run one study on a model over images (or a cache) and write JSON + PNGs.")
    studies = p.add_subparsers(dest="study", metavar="NAME")
    for group in STUDY_GROUPS:
        name = f"interp.commands.{group}"
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(studies)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
