"""HDF5 activation cache: stream hook activations of a HookedViT to disk, read them back lazily.

>>> import interp.cache
>>> summary = interp.cache.write(model, photos, hooks="blocks.*.hook_resid_post", path="acts.h5", progress=False)
>>> with interp.cache.open("acts.h5", model=model) as cache:
...     x = cache["blocks.5.hook_resid_post"][:2]   # ndarray [2, T, D], read from the file
>>> x.shape
(2, 197, 192)

File format: docs/cache-format.md (``FORMAT_VERSION``).
"""
from .format import FORMAT_VERSION
from .reader import HookView, Reader, open
from .writer import WriteSummary, write

__all__ = ["write", "open", "Reader", "HookView", "WriteSummary", "FORMAT_VERSION"]
