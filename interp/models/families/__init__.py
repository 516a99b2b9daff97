"""Model families: one adapter per timm model class (:class:`~interp.models.families.base.Family`), which says
what the model is (blocks, token layout, sizes, write directions) and how interp runs it with hook points.

Adding a family is one module here (a ``Family`` subclass, imported below) and its parity test against timm's
own forward.
"""
from __future__ import annotations

from torch import nn

from ...errors import UnsupportedModelError
from .base import Family, supported_families
from .vit import VitFamily
from .eva import EvaFamily  # noqa: E402 (after ViT: registration order is the order users read)
from .pvt import PvtV2Family  # noqa: E402
from .swin import SwinV2Family  # noqa: E402

__all__ = ["EvaFamily", "Family", "PvtV2Family", "SwinV2Family", "VitFamily", "family_of", "family_of_entry_module",
           "supported_families"]


def family_of(module: nn.Module) -> Family:
    """The adapter of ``module``'s family, bound to it, after checking the variant is instrumented.

    Raises:
        UnsupportedModelError: no family instruments this class, or this variant of it.
    """
    for cls in Family.registry:
        if cls.matches(module):
            family = cls(module)
            family.check()
            return family
    raise UnsupportedModelError(f"{type(module).__name__} is not a model family interp instruments; "
                                f"{supported_families()}")


def family_of_entry_module(module_name: str) -> type:
    """The family whose timm entry points live in ``module_name`` (e.g. ``timm.models.eva``), checked from a
    model's name before it is built.

    Raises:
        UnsupportedModelError: no family is built there.
    """
    for cls in Family.registry:
        if module_name in cls.timm_modules:
            return cls
    raise UnsupportedModelError(f"a {module_name.rsplit('.', 1)[-1]} model is not a family interp instruments; "
                                f"{supported_families()}")
