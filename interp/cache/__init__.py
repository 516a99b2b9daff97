"""HDF5 activation cache: stream hook activations of a HookedViT to disk, read them back lazily.

>>> import interp.cache
>>> summary = interp.cache.write(model, photos, hooks="blocks.*.hook_resid_post", path="acts.h5", progress=False)
>>> with interp.cache.open("acts.h5", model=model) as cache:
...     x = cache["blocks.5.hook_resid_post"][:2]   # ndarray [2, T, D], read from the file
>>> x.shape
(2, 197, 192)

File format: docs/cache-format.md (``FORMAT_VERSION``).

The names below are resolved lazily (PEP 562 ``__getattr__``, as ``interp/__init__.py`` does), so the command
line can take a cache's writer lock (:mod:`interp.cache.lock`, torch-free) before torch, h5py or
transformer_lens are imported.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> (module, attribute)
_LAZY = {
    "FORMAT_VERSION": ("interp.cache.format", "FORMAT_VERSION"),
    "HookView": ("interp.cache.reader", "HookView"),
    "CacheReader": ("interp.cache.reader", "CacheReader"),
    "open": ("interp.cache.reader", "open"),
    "WriteSummary": ("interp.cache.writer", "WriteSummary"),
    "write": ("interp.cache.writer", "write"),
}

__all__ = ["write", "open", "CacheReader", "HookView", "WriteSummary", "FORMAT_VERSION"]

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time the names come from __getattr__
    from .format import FORMAT_VERSION
    from .reader import HookView, CacheReader, open
    from .writer import WriteSummary, write


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use, and keep the value in the package namespace."""
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
