"""TransformerLens glue for ``HookedViT``: hook points indexed in firing order, glob names everywhere.

Only public ``HookedRootModule`` methods are overridden (``add_hook``, ``hooks``, ``run_with_hooks``,
``run_with_cache``, ``get_caching_hooks``); each resolves exact names and glob patterns
(``blocks.*.hook_resid_post``) to exact hook names, raising :class:`~interp.errors.HookNameError` with close
matches for unknown ones, then calls TransformerLens with exact names only. What is relied on from
TransformerLens: ``setup()`` fills ``hook_dict`` with every ``HookPoint`` under its module path and sets
``HookPoint.name``; those public methods accept exact names and callables; ``run_with_cache`` returns
``(output, dict)``. ``tests/hooks/test_transformer_lens_contract.py`` checks exactly this.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Sequence, Tuple, Union

import torch

from ..errors import HookShapeError
from . import names as hook_names_mod
from .activations import ActivationDict

HookSpec = Tuple[Union[str, Callable[[str], bool]], Callable]


def shape_checked(fn: Callable) -> Callable:
    """``fn(tensor, hook)`` made to raise :class:`~interp.errors.HookShapeError` (naming the hook, the function
    and both shapes) when it returns a tensor of another shape than the activation it replaces, instead of a
    bare matmul error further on. ``None`` (observe only) and same-shape returns pass unchanged."""
    if getattr(fn, "_interp_shape_checked", False):
        return fn

    @functools.wraps(fn)
    def checked(tensor, *args, **kwargs):
        out = fn(tensor, *args, **kwargs)
        if isinstance(out, torch.Tensor) and isinstance(tensor, torch.Tensor) and out.shape != tensor.shape:
            hook = kwargs.get("hook", args[0] if args else None)
            where = getattr(hook, "name", None) or "a hook point"
            raise HookShapeError(f"hook function {getattr(fn, '__name__', repr(fn))!r} on {where} returned shape "
                                 f"{list(out.shape)}, but {where} carries {list(tensor.shape)}: return the "
                                 "activation edited in place or a tensor of that same shape (or None to only read it)")
        return out

    checked._interp_shape_checked = True
    return checked


class HookRegistry:
    """Mixin placed before ``HookedRootModule``: name resolution in front of its public hook methods."""

    def _index_hook_points(self, firing_order: Sequence[str]) -> None:
        """Let TransformerLens name the hook points (``setup``), then order ``hook_dict`` as they fire.

        Raises:
            RuntimeError: TransformerLens' ``setup`` did not index exactly the expected hook points.
        """
        self.setup()
        found = set(self.hook_dict)
        missing = [n for n in firing_order if n not in found]
        unexpected = sorted(found - set(firing_order))
        if missing or unexpected:
            raise RuntimeError(
                "transformer_lens HookedRootModule.setup() indexed other hook points than interp expects "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]}); this transformer-lens version is "
                "not supported: install the version pinned in interp's pyproject.toml"
            )
        self.hook_dict = {name: self.hook_dict[name] for name in firing_order}

    def hook_names(self) -> List[str]:
        """Every hook name, in the order the hooks fire."""
        return list(self.hook_dict)

    def resolve_hooks(self, spec: hook_names_mod.NamesSpec) -> List[str]:
        """Hook names selected by an exact name, a glob pattern, a list of those, or a callable."""
        return hook_names_mod.resolve(spec, self.hook_names())

    def _expand(self, hooks: Sequence[HookSpec], check_shapes: bool = True) -> List[HookSpec]:
        """``[(name or pattern or callable, fn)]`` -> the same with every string replaced by exact names (and,
        for forward hooks, ``fn`` wrapped by :func:`shape_checked`)."""
        known = self.hook_names()
        out: List[HookSpec] = []
        for name, fn in hooks:
            fn = shape_checked(fn) if check_shapes else fn
            if isinstance(name, str):
                out.extend((key, fn) for key in hook_names_mod.match(name, known))
            else:
                out.append((name, fn))
        return out

    def add_hook(self, name, hook, *args, **kwargs) -> None:
        """TransformerLens ``add_hook``; ``name`` may also be a glob pattern."""
        if kwargs.get("dir", args[0] if args else "fwd") == "fwd":
            hook = shape_checked(hook)
        if not isinstance(name, str):
            return super().add_hook(name, hook, *args, **kwargs)
        for key in hook_names_mod.match(name, self.hook_names()):
            super().add_hook(key, hook, *args, **kwargs)

    @contextmanager
    def hooks(self, fwd_hooks: Sequence[HookSpec] = (), bwd_hooks: Sequence[HookSpec] = (), *args,
              **kwargs) -> Iterator[Any]:
        """TransformerLens ``hooks`` context manager; names may be glob patterns. Always removes its hooks."""
        with super().hooks(self._expand(fwd_hooks), self._expand(bwd_hooks, False), *args, **kwargs) as model:
            yield model

    def run_with_hooks(self, *model_args, fwd_hooks: Sequence[HookSpec] = (), bwd_hooks: Sequence[HookSpec] = (),
                       **kwargs):
        """TransformerLens ``run_with_hooks``; names may be glob patterns."""
        return super().run_with_hooks(*model_args, fwd_hooks=self._expand(fwd_hooks),
                                      bwd_hooks=self._expand(bwd_hooks, False), **kwargs)

    def _resolve_filter(self, names_filter):
        if names_filter is None or callable(names_filter):
            return names_filter
        return self.resolve_hooks(names_filter)

    def run_with_cache(self, *model_args, names_filter=None, **kwargs) -> Tuple[Any, ActivationDict]:
        """TransformerLens ``run_with_cache``: ``(output, cache)``, cache an :class:`ActivationDict`.

        ``names_filter``: None (all hooks), an exact name or glob pattern, a list of those, or a callable.
        """
        out, cache = super().run_with_cache(*model_args, names_filter=self._resolve_filter(names_filter), **kwargs)
        return out, ActivationDict(cache, hook_names=self.hook_names())

    def get_caching_hooks(self, names_filter=None, *args, **kwargs):
        """TransformerLens ``get_caching_hooks``; names may be glob patterns."""
        return super().get_caching_hooks(self._resolve_filter(names_filter), *args, **kwargs)
