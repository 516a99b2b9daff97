"""TransformerLens's activation-patching arithmetic, transcribed as a test oracle (never imported by interp).

Reference: TransformerLensOrg/TransformerLens, ``transformer_lens/patching.py`` (commit
c9937fd016b9748afd81e9e39d4df869431387c4): ``generic_activation_patch`` (one patched forward per row of the index
frame, the hook clones the activation when it requires grad and hands it to the patch setter with the clean
cache's value; the metric of each patched run's logits is stored), ``layer_pos_patch_setter`` and
``layer_head_vector_patch_setter``; and ``PatchingResult.normalized``: ``(values - corrupted) / (clean -
corrupted)``. The model is any ``HookedRootModule`` (``run_with_hooks``); the hook names are TransformerLens's
``get_act_name`` spellings, here the hooked ViT's.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Dict, List, Sequence

import torch


def layer_pos_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, pos]: the clean row at ``pos`` of every image (axis order [batch, pos, ...])."""
    assert len(index) == 2
    layer, pos = index
    corrupted_activation[:, pos, ...] = clean_activation[:, pos, ...]
    return corrupted_activation


def layer_head_vector_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head_index]: the clean head at every position ([batch, pos, head_index, ...])."""
    assert len(index) == 2
    layer, head_index = index
    corrupted_activation[:, :, head_index] = clean_activation[:, :, head_index]
    return corrupted_activation


def generic_activation_patch(model, corrupted_tokens: torch.Tensor, clean_cache: Dict[str, torch.Tensor],
                             patching_metric: Callable[[torch.Tensor], torch.Tensor], patch_setter,
                             act_name: Callable[[int], str], rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """The metric of one patched forward per index row (flattened output, as with an explicit ``index_df``)."""
    store = torch.zeros(len(rows))

    def patching_hook(corrupted_activation, hook, index, clean_activation):
        if corrupted_activation.requires_grad:
            corrupted_activation = corrupted_activation.clone()
        return patch_setter(corrupted_activation, index, clean_activation)

    for c, index in enumerate(rows):
        index = list(index)
        name = act_name(index[0])
        hook = partial(patching_hook, index=index, clean_activation=clean_cache[name])
        with torch.no_grad():
            patched_logits = model.run_with_hooks(corrupted_tokens, fwd_hooks=[(name, hook)])
        store[c] = patching_metric(patched_logits)
    return store


def normalized(values: torch.Tensor, clean: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    """``PatchingResult.normalized``: 0 = the patch did nothing, 1 = it restored the clean metric."""
    return (values - corrupted) / (clean - corrupted)


def rows(layers: Sequence[int], n: int) -> List[List[int]]:
    """``make_df_from_ranges``' rows for [layer, pos] (or [layer, head]): every layer, then every index."""
    return [[layer, i] for layer in layers for i in range(n)]
