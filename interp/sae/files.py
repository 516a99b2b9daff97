"""Atomic writes of an SAE run's files: a crash or a full disk leaves the previous file whole."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import InterpError


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


RESUME_HINT = "Free disk space or choose another --out, then rerun with --resume"


def write_atomic(path: Path, data: bytes, what: str, hint: str = RESUME_HINT) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename; one-line error (ending with ``hint``) if
    that fails."""
    path = Path(path)
    if os.path.lexists(path) and not (os.path.exists(path) and stat.S_ISREG(os.stat(path).st_mode)):
        raise InterpError(f"{str(path)!r} is not a regular file (a device node, FIFO, socket or a link to one); "
                          f"interp never replaces it: move it away or choose another --out")
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process: never another's
    try:
        _write(tmp, data)
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        kept = "the previous file is kept" if path.exists() else "nothing was written"
        raise InterpError(f"cannot write the {what} {str(path)!r} ({e.strerror or e}); {kept}. {hint}") from None
