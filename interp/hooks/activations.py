"""``ActivationDict``: the ``{hook name: tensor}`` dict ``run_with_cache`` returns, with helpful misses."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from ..errors import HookNameError, close_matches


class ActivationDict(dict):
    """A plain ``dict`` of cached activations whose missing-key error names close hook names.

    ``cache["blocks.1.hook_resid_pots"]`` raises :class:`~interp.errors.HookNameError` (a ``KeyError``)
    listing the close names; a real hook name that was not cached says to add it to ``names_filter``.
    ``in``, ``get`` and iteration behave as for any dict.

    Args:
        values: {hook name: Tensor}.
        hook_names: every hook name of the model (for the suggestions), in firing order.
    """

    def __init__(self, values: Mapping = (), hook_names: Iterable[str] = ()):
        super().__init__(values)
        self.hook_names: Sequence[str] = tuple(hook_names)

    def __missing__(self, key):
        if not isinstance(key, str):
            raise KeyError(key)
        cached = list(self)
        if key in self.hook_names:
            near = close_matches(key, cached)
            hint = f" Cached close names: {', '.join(near)}." if near else ""
            raise HookNameError(f"{key!r} was not cached: this run kept {len(cached)} hook(s) "
                                f"(names_filter). Add {key!r} to names_filter.{hint}")
        near = close_matches(key, cached) or close_matches(key, self.hook_names)
        hint = f" Close matches: {', '.join(near)}." if near else ""
        raise HookNameError(f"{key!r} is not a cached hook name.{hint} "
                            "List every hook with model.hook_names() or `interp hooks MODEL`.")
