"""HDF5 activation cache: stream hook activations of a HookedViT to disk, read them back lazily.

>>> import interp, interp.cache
>>> model = interp.load("vit_small_patch14_reg4_dinov2")
>>> interp.cache.write(model, "images/", hooks="blocks.*.hook_resid_post", path="acts.h5")
>>> with interp.cache.open("acts.h5", model=model) as cache:
...     x = cache["blocks.11.hook_resid_post"][:8]   # ndarray [8, T, D]

File format: docs/cache-format.md (``FORMAT_VERSION``).
"""
from .format import FORMAT_VERSION
from .reader import HookView, Reader, open
from .writer import WriteSummary, write

__all__ = ["write", "open", "Reader", "HookView", "WriteSummary", "FORMAT_VERSION"]
