"""Exceptions raised by interp. Each message says what went wrong and how to fix it."""
from __future__ import annotations

import difflib
from typing import Iterable


class InterpError(Exception):
    """Base class of every error interp raises on bad input."""


class InterpWarning(UserWarning):
    """A warning interp gives the user of a run (skipped images, no artifacts, an incomplete cache...): its own
    category, so a program or the test suite can tell it from other libraries' warnings."""


class ModelLoadError(InterpError):
    """A model could not be built or its weights could not be loaded."""


class UnsupportedModelError(InterpError):
    """The model is not a timm ViT family that interp instruments."""


class UsageError(InterpError):
    """A command-line value or path is wrong (the CLI exits with status 2, as argparse does)."""


class HookNameError(UsageError, KeyError):
    """A hook name (or pattern) matches no hook point: a mistyped name, a bad value (exit status 2, on every
    family)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class HookShapeError(InterpError, ValueError):
    """A hook function returned a tensor of another shape than the activation it replaces."""


class ImageError(InterpError):
    """An image could not be read, or has a size the model cannot take."""


class ImageTooLargeError(ImageError):
    """An image has more pixels than can be decoded safely (PIL's decompression-bomb limit): skipped and
    recorded like any unreadable image."""


class CacheError(InterpError):
    """An activation cache file is missing, from another model/version, or in use."""


class PatchError(InterpError):
    """A patch file is corrupt or was made for another model."""


def close_matches(word: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """Up to ``n`` candidates that look like ``word`` (best first)."""
    candidates = list(candidates)
    found = difflib.get_close_matches(word, candidates, n=n, cutoff=0.6)
    if not found:
        tail = word.split(".")[-1]
        found = [c for c in candidates if c.endswith(tail)][:n]
    return found


class UnknownModelError(ModelLoadError, UsageError):
    """A model name neither timm nor interp knows (a mistyped name): a bad command-line value, exit status 2."""


class InputPathError(UsageError):
    """An input path that exists but cannot be read as a file or folder (a FIFO, a device node, a socket, a
    symlink to one): refused before it is opened, since reading a FIFO waits for a writer forever. A bad
    command-line value, exit status 2."""


class OutputError(InterpError):
    """An output cannot be written: read-only or full disk, a path under a regular file, a locked folder."""


class OutputPathError(OutputError, UsageError):
    """An output path of the wrong kind (a file where a folder is wanted, a folder where a file is, a path under
    a regular file): a bad command-line value, exit status 2."""
