"""The hook-point layer: :class:`~interp.hooks.hooked_vit.HookedViT` (``interp.hooks.hooked_vit``), hook names
and their resolution (``interp.hooks.names``, torch-free: the command line and the studies' declarations build
hook names without importing torch), and the structural edit state it honours (``interp.hooks.edit_state``)."""
