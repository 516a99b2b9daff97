"""Atomic writes of an SAE run's files: a crash or a full disk leaves the previous file whole."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import InterpError


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: Path, data: bytes, what: str) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename; one-line error if that fails."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        _write(tmp, data)
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        kept = "the previous file is kept" if path.exists() else "nothing was written"
        raise InterpError(f"cannot write the {what} {str(path)!r} ({e.strerror or e}); {kept}. Free disk space "
                          "or choose another --out, then rerun with --resume") from None
