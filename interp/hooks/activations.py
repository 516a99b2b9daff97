"""``ActivationDict``: the ``{hook name: tensor}`` dict ``run_with_cache`` returns, with helpful misses."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from ..errors import HookNameError, close_matches
from .names import block_hook

# TransformerLens' short activation names (``utils.get_act_name``) -> interp's per-block hook suffixes.
BLOCK_ACT_NAMES = {
    "resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid", "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out",
    "q": "attn.hook_q", "k": "attn.hook_k", "v": "attn.hook_v", "z": "attn.hook_z",
    "query": "attn.hook_q", "key": "attn.hook_k", "value": "attn.hook_v",
    "attn_scores": "attn.hook_attn_scores", "attn_logits": "attn.hook_attn_scores",
    "pattern": "attn.hook_pattern", "attn": "attn.hook_pattern",
    "pre": "mlp.hook_pre", "post": "mlp.hook_post", "mlp_pre": "mlp.hook_pre", "mlp_post": "mlp.hook_post",
}
ROOT_ACT_NAMES = {"embed": "hook_embed", "norm_final": "hook_norm_final", "pooled": "hook_pooled",
                  "logits": "hook_logits"}


def act_name(key, hook_names: Sequence[str]) -> str:
    """A TransformerLens-style cache key -> hook name: ``("resid_post", 5)`` -> ``blocks.5.hook_resid_post``,
    ``("q", -1)`` -> the last block's queries, ``("embed",)`` -> ``hook_embed``; a hook name stays as it is.

    Raises:
        HookNameError: an unknown short name or a block outside the model (the valid range named).
    """
    if isinstance(key, str):
        return key
    if not isinstance(key, tuple) or not key or not isinstance(key[0], str):
        raise HookNameError(f"cache key {key!r}: use a hook name or (name, layer), e.g. ('resid_post', 5)")
    name, layer = key[0], (key[1] if len(key) > 1 else None)
    if layer is None:
        if name in ROOT_ACT_NAMES or name.startswith("hook_"):
            return ROOT_ACT_NAMES.get(name, name)
        raise HookNameError(f"cache key {key!r}: {name!r} is a per-block activation: give its block, "
                            f"e.g. ({name!r}, 0)")
    if name not in BLOCK_ACT_NAMES:
        near = close_matches(name, BLOCK_ACT_NAMES)
        hint = f" Close matches: {', '.join(near)}." if near else ""
        raise HookNameError(f"cache key {key!r}: {name!r} is not a per-block activation name.{hint} "
                            f"Known: {', '.join(sorted(BLOCK_ACT_NAMES))}")
    n_blocks = 1 + max((int(h.split(".")[1]) for h in hook_names if h.startswith("blocks.")), default=-1)
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n_blocks <= layer < n_blocks:
        raise HookNameError(f"cache key {key!r}: block {layer!r} does not exist, this model has {n_blocks} blocks "
                            f"(0-{n_blocks - 1}, or -1 for the last)")
    return block_hook(layer % n_blocks, BLOCK_ACT_NAMES[name])


class ActivationDict(dict):
    """A plain ``dict`` of cached activations whose missing-key error names close hook names.

    ``cache["blocks.1.hook_resid_pots"]`` raises :class:`~interp.errors.HookNameError` (a ``KeyError``)
    listing the close names; a real hook name that was not cached says to add it to ``names_filter``.
    TransformerLens keys work too: ``cache["resid_post", 5]`` is ``cache["blocks.5.hook_resid_post"]``
    (``("q", -1)``: the last block's queries; see :func:`act_name`). ``in``, ``get`` and iteration behave as
    for any dict of hook names.

    Args:
        values: {hook name: Tensor}.
        hook_names: every hook name of the model (for the suggestions), in firing order.
    """

    def __init__(self, values: Mapping = (), hook_names: Iterable[str] = ()):
        super().__init__(values)
        self.hook_names: Sequence[str] = tuple(hook_names)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            key = act_name(key, self.hook_names or tuple(self))
        return super().__getitem__(key)

    def __missing__(self, key):
        if not isinstance(key, str):
            raise KeyError(key)
        cached = list(self)
        if key in self.hook_names:
            near = close_matches(key, cached)
            hint = f" Cached close names: {', '.join(near)}." if near else ""
            raise HookNameError(f"{key!r} was not cached: this run kept {len(cached)} hook(s) "
                                f"(names_filter). Add {key!r} to names_filter.{hint}")
        near = close_matches(key, cached) or close_matches(key, self.hook_names)
        hint = f" Close matches: {', '.join(near)}." if near else ""
        raise HookNameError(f"{key!r} is not a cached hook name.{hint} "
                            "List every hook with model.hook_names() or `interp hooks MODEL`.")
