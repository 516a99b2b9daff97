"""interp: mechanistic interpretability of Vision Transformer artifacts on any timm ViT."""
__version__ = "0.1.0"

from .api import load
from .errors import (CacheError, HookNameError, ImageError, InterpError, ModelLoadError, PatchError,
                     UnsupportedModelError)
from .hooks import HookedViT
from .models import TokenLayout, load_images
from . import patch  # noqa: E402  (interp.patch.save / apply)

__all__ = [
    "load", "load_images", "HookedViT", "TokenLayout", "InterpError", "ModelLoadError",
    "UnsupportedModelError", "HookNameError", "ImageError", "CacheError", "PatchError", "__version__",
]
