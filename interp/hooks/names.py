"""Resolve hook specifications (exact names, glob patterns, lists, callables) to hook names."""
from __future__ import annotations

import fnmatch
from typing import Callable, Iterable, List, Optional, Sequence, Union

from ..errors import HookNameError, close_matches

NamesSpec = Union[None, str, Sequence[str], Callable[[str], bool]]

_GLOB_CHARS = set("*?[")


def is_pattern(name: str) -> bool:
    return any(c in _GLOB_CHARS for c in name)


def unknown_hook_error(name: str, known: Sequence[str]) -> HookNameError:
    hints = close_matches(name, known)
    hint = f" Close matches: {', '.join(hints)}." if hints else ""
    kind = "pattern" if is_pattern(name) else "hook name"
    return HookNameError(
        f"{kind} {name!r} matches no hook point.{hint} "
        "List every hook with model.hook_names() or `interp hooks MODEL`."
    )


def match(name_or_pattern: str, known: Sequence[str]) -> List[str]:
    """Hook names matching one exact name or glob pattern (``blocks.*.hook_resid_post``), in model order.

    Raises:
        HookNameError: nothing matches; the message lists close matches.
    """
    if is_pattern(name_or_pattern):
        found = [n for n in known if fnmatch.fnmatchcase(n, name_or_pattern)]
    else:
        found = [name_or_pattern] if name_or_pattern in set(known) else []
    if not found:
        raise unknown_hook_error(name_or_pattern, known)
    return found


def resolve(spec: NamesSpec, known: Sequence[str]) -> List[str]:
    """All hook names selected by ``spec`` (None = all), in model order, without duplicates."""
    if spec is None:
        return list(known)
    if callable(spec):
        return [n for n in known if spec(n)]
    if isinstance(spec, str):
        spec = [spec]
    chosen = set()
    for item in spec:
        if not isinstance(item, str):
            raise TypeError(f"hook names must be strings, got {type(item).__name__}")
        chosen.update(match(item, known))
    return [n for n in known if n in chosen]
