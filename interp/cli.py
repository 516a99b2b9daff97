"""The ``interp`` command line. Thin: each sub-command lives in ``interp/commands/<name>.py`` and
exposes ``register(subparsers)``, which declares its options (a frozen dataclass of ``option()`` fields) and its
function with :func:`interp.commands.inputs.command`. After parsing, the Namespace is read here once: into the
command's options dataclass(es) and the run's :class:`~interp.commands.inputs.RunInputs`, which the command's
function receives; nothing is written onto it or read from it later.

Building the parsers imports neither torch, timm nor nnsight (a command imports them when it runs), so
``interp --help`` and argument errors answer at once; ``tests/cli/test_cli_policies.py`` checks it. The model
name(s), image folders and output checks run before torch too (:mod:`interp.commands.prechecks`,
``tests/cli/test_cli_fast_feedback.py``).

Errors: every problem interp knows about (an :class:`~interp.errors.InterpError`) is one line on stderr,
``interp: error: ...``; exit status 2 for a bad command-line value or path (argparse's and
:class:`~interp.errors.UsageError`), 1 for the rest, 130 after Ctrl-C. Any other exception is a bug and keeps
its traceback."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import os
import signal
import sys
import warnings
from typing import List, Optional

from .errors import InterpError, UsageError

COMMANDS = ("hooks", "cache", "patch", "study", "report", "compare", "reassess", "explore", "classifier", "sae")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: ``interp: error: <what> (see `interp cmd --help`)``, exit status 2, and
    no abbreviations (``--batch`` is not ``--batch-size``: a former option name must never silently mean
    another option)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"interp: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from ._version import __version__

    parser = Parser(
        prog="interp",
        description="Mechanistic interpretability of ViT artifacts (high-norm tokens, register neurons) on timm models.",
    )
    parser.add_argument("--version", action="version", version=f"interp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module_name = f"interp.commands.{name}"
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run one ``interp`` command; returns the exit status. ``argv`` None: the program's own command line (then
    a Ctrl-C after the command is done, during Python's shutdown, also exits 130 without a traceback)."""
    try:
        return _main(argv)
    except KeyboardInterrupt as e:  # a command may say what was kept and how to continue (interp cache)
        print("interp: interrupted" + (f": {e.args[0]}" if e.args else ""), file=sys.stderr)
        return 130
    finally:
        if argv is None:
            _quiet_interrupts()


_PARSER: List[argparse.ArgumentParser] = []  # the parser main() reuses: built on its first call in a process


def _parser() -> argparse.ArgumentParser:
    """:func:`build_parser`'s parser, built once per process (a program or test suite that calls :func:`main`
    many times builds every command's options once; parsing keeps no state in the parser)."""
    if not _PARSER:
        _PARSER.append(build_parser())
    return _PARSER[0]


def _main(argv: Optional[List[str]]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a bad argument (one line already shown)
        return e.code if isinstance(e.code, int) else 2
    command = getattr(args, "func", None)
    if command is None:
        parser.print_help()
        return 2
    from . import _progress, console
    from .commands.inputs import RunInputs
    from .commands.prechecks import check_before_torch

    shown_format = warnings.formatwarning
    try:
        options = command.parse(args)  # the last read of args: options dataclasses (checked) and the run inputs
        inputs = RunInputs.of(options, sys.argv[1:] if argv is None else argv)
        console.configure(quiet=inputs.quiet)  # one-line warnings; --quiet
        _progress.show_lines(inputs.stage_lines)  # a long run prints progress lines where no bar is drawn
        check_before_torch(options, inputs)  # model names, image folders: a mistake costs a second, not torch
        if inputs.quiet:  # no info lines: what a command prints on stdout is dropped (stderr still shows)
            with contextlib.redirect_stdout(io.StringIO()):
                return int(command(*options, inputs) or 0)
        return int(command(*options, inputs) or 0)
    except InterpError as e:
        print(f"interp: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except BrokenPipeError:  # `interp hooks MODEL | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        warnings.formatwarning = shown_format  # main() may run inside a program (tests, notebooks)
        _progress.show_lines(False)


def _quiet_interrupts() -> None:
    """From now on (the command is done; Python is shutting down) Ctrl-C ends the process at once with status
    130, instead of a KeyboardInterrupt traceback from an exit handler."""
    def stop(signum, frame):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream: nothing more to show
                pass
        os._exit(130)

    try:
        signal.signal(signal.SIGINT, stop)
    except ValueError:  # not the main thread
        pass


if __name__ == "__main__":
    sys.exit(main())
