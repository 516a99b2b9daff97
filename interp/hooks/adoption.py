"""Sharing a timm module's tensors with the ``HookedViT`` that instruments it.

``HookedViT`` registers the timm root's own parameters, buffers and children (the same objects) on itself,
so its ``state_dict`` has exactly timm's keys; a device or dtype move must then go through the timm module
and re-link the adopted root tensors, which :class:`AdoptsTimmRoot` does.
"""
from __future__ import annotations

from torch import nn


class AdoptsTimmRoot:
    """Mixin for an ``nn.Module`` with a ``timm_model`` attribute (not a submodule) whose root it adopts."""

    def _adopt_timm_root(self) -> None:
        """Register the timm root's parameters, buffers and children (same objects) on this module."""
        tm: nn.Module = self.timm_model
        for key, param in tm._parameters.items():
            if param is not None:
                self.register_parameter(key, param)
        for key, buf in tm._buffers.items():
            if buf is not None:
                self.register_buffer(key, buf, persistent=key not in tm._non_persistent_buffers_set)
        for key, child in tm.named_children():
            self.add_module(key, child)

    def _apply(self, fn, recurse=True):
        """``nn.Module._apply`` (``.to``, ``.half``...): convert through the timm module (children are
        shared), re-link the adopted root tensors, convert own children, then ``_after_apply(fn)``."""
        self.timm_model._apply(fn, recurse)
        for key in list(self._parameters):
            self._parameters[key] = self.timm_model._parameters[key]
        for key in list(self._buffers):
            self._buffers[key] = self.timm_model._buffers[key]
        for key, child in self._modules.items():
            if key not in self.timm_model._modules and child is not None:
                child._apply(fn, recurse)
        self._after_apply(fn)
        return self

    def _after_apply(self, fn) -> None:
        """Convert tensors held outside parameters and buffers (none by default)."""
