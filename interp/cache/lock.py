"""One writer per cache file: an advisory ``flock`` on ``<file>.lock`` holding the writer's pid.

The kernel drops a ``flock`` when its process dies (even by ``kill -9``), so a lock file left by a dead
writer never blocks a resume; the pid inside only makes the refusal message useful. The lock is taken on
the file's resolved path, so a symlink to a file being written is refused like the file itself.
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import Optional, Union

from ..errors import CacheError


def lock_path(path: Union[str, Path]) -> Path:
    """``<resolved path>.lock``: the lock of the file a path (or a symlink to it) names."""
    path = Path(os.path.realpath(path))
    return path.with_name(path.name + ".lock")


class LockHeld(CacheError):
    """Another process holds the lock; ``holder`` says which (``pid N on HOST``, read from the lock file)."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


class WriterLock:
    """Exclusive right to write ``path``. Use as a context manager, or ``acquire()`` / ``release()``."""

    def __init__(self, path: Union[str, Path]):
        self.target = Path(path)
        self.path = lock_path(path)
        self._fd: Optional[int] = None

    def acquire(self) -> "WriterLock":
        """Take the lock. Raises :class:`LockHeld` (a CacheError) when another process holds it, OSError when the lock file cannot
        be created (a read-only folder: callers say it their way)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown process"
                os.close(fd)
                raise LockHeld(
                    f"{str(self.target)!r} is being written by another process ({holder}; lock "
                    f"{str(self.path)!r}). Wait for it to finish or stop it, then rerun with --resume.", holder
                ) from None
            # The previous holder may have unlinked the lock file between our open and flock: retry.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
