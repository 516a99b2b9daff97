"""``interp study NAME MODEL ...``: run one study and write its JSON result and figures.

The studies come from one table, :data:`interp.commands.registry.STUDIES` (name -> the study's descriptor with
``add_arguments(parser)`` and ``run(args, study function)``; the function is the one the descriptor names).
Before the study's own run, the output is checked (an existing ``<study>.json`` is not replaced without
``--overwrite``); the study then writes into a staging folder that replaces the old result only once it is complete
(:func:`interp.commands.output.atomic_output_dir`, which also locks the result against a second run).
"""
from __future__ import annotations

from .registry import STUDIES, StudyCommand


def _run_study(command: StudyCommand):
    def run(args) -> int:
        from .saving import prepare_study_output
        from .output import atomic_output_dir

        name = command.result_name
        old_figures = prepare_study_output(args, name)
        out = args.out
        with atomic_output_dir(out, f"{name}.json", replaces=old_figures, what=f"{name} result") as staging:
            args.out = str(staging)  # the study writes its JSON and figures here; moved into `out` when complete
            try:
                code = command(args)  # the study function comes from the descriptor
            finally:
                args.out = out
        return code

    return run


def register(sub) -> None:
    p = sub.add_parser("study", help="run one study (norms, neurons, ablate, relocate, patch-score, pib, ...)",
                       description="Run one study on a model over images (or a cache) and write JSON + PNGs.")
    studies = p.add_subparsers(dest="study", metavar="NAME")
    for command in STUDIES.values():
        parser = studies.add_parser(command.name, help=command.help)
        command.add_arguments(parser)
        parser.set_defaults(func=_run_study(command))
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
