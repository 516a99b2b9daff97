"""The ``interp`` command line. Thin: each sub-command lives in ``interp/commands/<name>.py`` and
exposes ``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.

Building the parsers imports neither torch, timm nor nnsight (a command imports them when it runs), so
``interp --help`` and argument errors answer at once; ``tests/test_cli_policies.py`` checks it."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import sys
import warnings
from typing import List, Optional

from .errors import InterpError

COMMANDS = ("hooks", "cache", "patch", "study", "report", "compare", "explore")


def build_parser() -> argparse.ArgumentParser:
    from ._version import __version__

    parser = argparse.ArgumentParser(
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from . import console

    shown_format = warnings.formatwarning
    console.configure(args)  # one-line warnings; args.progress: bars only on a terminal; --quiet
    try:
        if args.quiet:  # no info lines: what a command prints on stdout is dropped (stderr still shows)
            with contextlib.redirect_stdout(io.StringIO()):
                return int(args.func(args) or 0)
        return int(args.func(args) or 0)
    except InterpError as e:
        print(f"interp: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interp: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = shown_format  # main() may run inside a program (tests, notebooks)


if __name__ == "__main__":
    sys.exit(main())
