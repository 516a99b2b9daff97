"""interp: mechanistic interpretability of Vision Transformer artifacts on any timm ViT.

The names below are resolved lazily (PEP 562 ``__getattr__``): ``import interp`` imports neither torch,
timm nor nnsight; the first use of ``interp.load``, ``interp.HookedViT``... imports what that name needs.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# public name -> (module, attribute); attribute None means the module itself
_LAZY = {
    "load": ("interp.hooks.load", "load"),
    "load_images": ("interp.models.inputs.preprocessing", "load_images"),
    "HookedViT": ("interp.hooks.hooked_vit", "HookedViT"),
    "TokenLayout": ("interp.models.layout", "TokenLayout"),
    # a model family from outside the package (a Family subclass: hook points + token layout)
    "register_family": ("interp.models.families", "register_family"),
    # classifier files (zero-shot matrix, linear head, DINOv2 linear head) for the behaviour metrics
    "load_classifier": ("interp.models.classifiers.classifier", "load_classifier"),
    "save_classifier": ("interp.models.classifiers.classifier", "save_classifier"),
    "InterpError": ("interp.errors", "InterpError"),
    "ModelLoadError": ("interp.errors", "ModelLoadError"),
    "UnsupportedModelError": ("interp.errors", "UnsupportedModelError"),
    "HookNameError": ("interp.errors", "HookNameError"),
    "ImageError": ("interp.errors", "ImageError"),
    "CacheError": ("interp.errors", "CacheError"),
    "PatchError": ("interp.errors", "PatchError"),
    # patch files (save / apply / show / export_weights) live with the interventions
    "patch": ("interp.interventions.export", None),
    # the interactive explorer: interp.explore.start(model, images)
    "explore": ("interp.explore", None),
}

__all__ = [
    "load", "load_images", "HookedViT", "TokenLayout", "register_family", "load_classifier", "save_classifier", "InterpError", "ModelLoadError",
    "UnsupportedModelError", "HookNameError", "ImageError", "CacheError", "PatchError", "explore", "__version__",
]

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time the names come from __getattr__
    from .hooks.load import load
    from .errors import (CacheError, HookNameError, ImageError, InterpError, ModelLoadError, PatchError,
                         UnsupportedModelError)
    from .hooks.hooked_vit import HookedViT
    from .models.classifiers.classifier import load_classifier, save_classifier
    from .models.families import register_family
    from .models.layout import TokenLayout
    from .models.inputs.preprocessing import load_images


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use, and keep the value in the package namespace."""
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        # A subpackage not imported yet (``interp.models``, ``interp.cache``...): import it on access.
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        globals()[name] = module
        return module
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
