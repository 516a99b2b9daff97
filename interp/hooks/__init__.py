"""The hook-point layer: HookedViT, hook-name resolution, and the structural edit state it honours."""
from transformer_lens.hook_points import HookPoint

from .activations import ActivationDict
from .edit_state import EditState
from .hooked_vit import HookedViT
from .names import resolve as resolve_hook_names

__all__ = ["HookedViT", "HookPoint", "resolve_hook_names", "EditState", "ActivationDict"]
