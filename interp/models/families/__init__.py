"""Model families: one adapter per timm model class (:class:`~interp.models.families.base.Family`), which says
what the model is (blocks, token layout, sizes, write directions) and how interp runs it with hook points.

Adding a family is one module here (a ``Family`` subclass with literal ``name``, ``title``, ``timm_modules``: the
command line reads them without torch, :func:`interp._model_names.declared_families`), its import below and its
parity test against timm's own forward; from outside the package, :func:`register_family`
(``interp.register_family``) adds one at run time. This package is the only code that reads timm's module
attributes (``tests/contract/test_timm_attributes.py``): the shared parts are here too (:mod:`.positions`: the
patch grid, position table, RoPE table and periods; :mod:`.traits`: what an MLP activation computes).
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from ...errors import InterpError, UnsupportedModelError
from .base import Family, supported_families
from .vit import VitFamily
from .eva import EvaFamily  # noqa: E402 (after ViT: registration order is the order users read)
from .pvt import PvtV2Family  # noqa: E402
from .swin import SwinV2Family  # noqa: E402

__all__ = ["EvaFamily", "Family", "PvtV2Family", "SwinV2Family", "VitFamily", "family_class", "family_of",
           "family_of_entry_module", "register_family", "supported_families"]
ADD_FAMILY_HINT = "add its family with interp.register_family (docs: Your own model)"


def register_family(family: type, *, replace: bool = False) -> type:
    """Add ``family`` (a :class:`Family` subclass with ``name``, ``title`` and ``timm_class()``) to the registry,
    from a user's script: models of exactly its ``timm_class()`` (and their subclasses no other family claims)
    get this adapter. Returns ``family`` (so it works as a class decorator); registering it again is a no-op, and
    a family of the same ``name`` (the script run again, in a notebook) replaces the earlier one.

    Raises:
        InterpError: not a Family subclass, no ``name``, or another family already claims that timm class
            (unless ``replace=True``).
    """
    if not (isinstance(family, type) and issubclass(family, Family)) or family is Family:
        raise InterpError(f"register_family takes a subclass of interp.models.families.Family, got {family!r}")
    if not family.name:
        raise InterpError(f"{family.__name__} has no name: set its class attribute name = '...'")
    target = family.timm_class()
    for other in list(Family.registry):
        if other is family:
            return family
        if other.timm_class() is target:
            if not replace and other.name != family.name:
                raise InterpError(f"{target.__name__} already has the family {other.__name__} ({other.name}); pass "
                                  "replace=True to use yours instead")
            Family.registry.remove(other)
    Family.registry.append(family)
    return family


def family_class(module: nn.Module) -> Optional[type]:
    """The family registered for ``module``'s exact class, else for its nearest base class in method resolution
    order (whose ``check`` refuses what the subclass overrides); None when no class on the way has one."""
    by_class = {}
    for cls in Family.registry:
        by_class.setdefault(cls.timm_class(), cls)
    for klass in type(module).__mro__:
        if klass in by_class:
            return by_class[klass]
    return None


def family_of(module: nn.Module) -> Family:
    """The adapter of ``module``'s family, bound to it, after checking the variant is instrumented.

    Raises:
        UnsupportedModelError: no family instruments this class, or this variant of it.
    """
    cls = family_class(module)
    if cls is not None:
        family = cls(module)
        family.check()
        return family
    raise UnsupportedModelError(f"{type(module).__name__} is not a model family interp instruments ({ADD_FAMILY_HINT}); "
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
