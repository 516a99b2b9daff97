"""The hook-point layer: HookedViT and hook-name resolution."""
from transformer_lens.hook_points import HookPoint

from .hooked_vit import HookedViT
from .names import resolve as resolve_hook_names

__all__ = ["HookedViT", "HookPoint", "resolve_hook_names"]
