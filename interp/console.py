"""What the ``interp`` command line shows on the terminal: one-line warnings, progress bars only where they
help, and ``--quiet``. Library code never prints; it warns (``warnings.warn``) and takes ``progress=``.

The CLI calls :func:`configure` once after parsing; commands then print their info lines with :func:`info`
(silent under ``--quiet``) and pass the run's ``progress`` (resolved once, :func:`progress_wanted`) to the
library.

Progress bars are shown only when all of these hold: stderr is a terminal, ``--no-progress`` and ``--quiet``
were not given, and the environment variable ``INTERP_NO_PROGRESS`` is unset (or ``0``/empty).
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Optional, TextIO

NO_PROGRESS_ENV = "INTERP_NO_PROGRESS"

_quiet = False


def progress_wanted(flag: bool = True, quiet: bool = False, stream: Optional[TextIO] = None) -> bool:
    """Whether to draw progress bars: ``flag`` (False for --no-progress), not quiet, INTERP_NO_PROGRESS unset,
    and ``stream`` (default stderr) a terminal."""
    if not flag or quiet:
        return False
    if os.environ.get(NO_PROGRESS_ENV, "").strip() not in ("", "0"):
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def format_warning(message, category, filename, lineno, line=None) -> str:
    """``interp: warning: <message>`` on one line (no source file, no Python source line)."""
    text = " ".join(str(message).split())
    return f"interp: warning: {text}\n"


def install_warning_format() -> None:
    """Show every warning as one clean line on stderr (for the CLI only; the library keeps Python's format)."""
    warnings.formatwarning = format_warning


def configure(quiet: bool = False) -> None:
    """For one command run: one-line warnings, and the quiet mode (no :func:`info` lines). Whether bars are
    drawn is resolved once with the run's inputs (:func:`progress_wanted`, ``interp.commands.inputs.RunInputs``)."""
    global _quiet
    _quiet = bool(quiet)
    install_warning_format()


def info(text: str) -> None:
    """An info line on stdout (what was written, a one-line result); nothing under ``--quiet``."""
    if not _quiet:
        print(text, flush=True)
