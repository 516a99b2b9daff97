"""Turn hook activations into the arrays a cache stores.

Per hook: keep the selected token rows, optionally reduce each token to its L2 norm, and cast to the
stored dtype. During a cache run this happens inside the forward pass: a hook copies each activation
into a reused batch buffer as soon as it fires (``copy_hooks``), so the forward never keeps the full
float32 activations alive and no new memory is touched per batch. The values are the ones
``run_with_cache`` returns, selected and cast.
"""
from __future__ import annotations

import queue
from typing import Callable, Dict, List, Set, Tuple

import numpy as np
import torch

from ..errors import CacheError
from ..hooks.names import BlockNames
from ..models.layout import TokenLayout
from .format import DTYPES, PATCH_ONLY_HOOKS, is_attention_map, token_axis, token_rows

_TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32}

Buffers = Dict[str, np.ndarray]  # hook -> ndarray[b, *stored shape]


class Extractor:
    """Selects, reduces and casts hook activations for storage.

    Args:
        hooks: hook names to store.
        layout: token layout for the input size of the run.
        blocks: the model's block names (each hook's rows follow its block's grid in a pyramid model).
        tokens: ``all``, ``prefix`` (CLS + registers), ``patches`` or ``cls`` (``patches`` of a model without
            prefix tokens is ``all``).
        norms_only: store the L2 norm of each token over its feature axes instead of the vector:
            [b, t, d] -> [b, t], q/k/v/z [b, t, h, dh] -> [b, t], pooled/logits [b, d] -> [b].
        dtype: ``float16`` or ``float32``.
    """

    def __init__(self, hooks: List[str], layout: TokenLayout, blocks: BlockNames, tokens: str = "all",
                 norms_only: bool = False, dtype: str = "float16"):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
        if norms_only:
            maps = [h for h in hooks if is_attention_map(h)]
            if maps:
                raise CacheError(f"norms_only stores per-token vector norms; attention maps have none ({maps[0]}). "
                                 "Cache attention patterns/scores in a run without --norms-only.")
        self.hooks = list(hooks)
        self.layout, self.blocks = layout, blocks
        if tokens == "patches" and layout.n_prefix == 0:
            tokens = "all"  # no prefix rows to drop: every hook's rows are its patches
        self.tokens = tokens
        self.rows = token_rows(layout, tokens)
        self.norms_only = norms_only
        self.dtype = dtype
        self.np_dtype = np.dtype(DTYPES[dtype])
        self.torch_dtype = _TORCH_DTYPES[dtype]

    def select(self, hook: str, act: torch.Tensor) -> torch.Tensor:
        """The stored part of one activation [b, ...]: token rows (a view) or per-token norms (float32)."""
        axis = token_axis(hook)  # per image; +1 for the batch axis
        if hook in PATCH_ONLY_HOOKS:
            pass  # [b, P, d]: patch rows only, stored whole
        elif axis is not None:
            n, layout = act.shape[axis + 1], self.blocks.layout_of(self.layout, hook)
            # a pyramid's attention hooks keep their own rows (PVTv2's reduced keys, Swin's windows), stored
            # whole: such a model has no prefix tokens, so every token mode it takes is "all"
            if n != layout.n_tokens and not (self.layout.stage_grids and self.tokens == "all"):
                raise CacheError(f"{hook} has {n} rows on its token axis but the token layout has "
                                 f"{layout.n_tokens} tokens ({layout.to_dict()})")
            if self.tokens != "all":
                act = act.narrow(axis + 1, self.rows.start, self.rows.stop - self.rows.start)
        if self.norms_only:
            first_feature = 1 if axis is None else axis + 2
            act = torch.linalg.vector_norm(act.float(), dim=tuple(range(first_feature, act.ndim)))
        return act

    def copy_hooks(self, buffers: Buffers, fired: Set[str]) -> List[Tuple[str, Callable]]:
        """Forward hooks (for ``run_with_hooks``) that write each hook's stored form into ``buffers``
        and add its name to ``fired``."""
        targets = {h: torch.from_numpy(buffers[h]) for h in self.hooks}

        def copy(tensor: torch.Tensor, hook) -> None:
            value = self.select(hook.name, tensor)
            if value.device != targets[hook.name].device:
                value = value.to(self.torch_dtype)  # cast on the GPU: half the bytes to copy
            targets[hook.name].copy_(value)  # casts on the CPU; no new memory
            fired.add(hook.name)

        return [(h, copy) for h in self.hooks]

    def check_fired(self, fired: Set[str]) -> None:
        """Raise :class:`CacheError` naming the first hook that is not in ``fired``."""
        missing = [h for h in self.hooks if h not in fired]
        if missing:
            raise CacheError(f"{missing[0]} did not fire during the forward pass; some hooks (e.g. "
                             "hook_selective_votes) fire only while an intervention that uses them is active")

    @torch.no_grad()
    def __call__(self, cache: Dict[str, torch.Tensor]) -> Buffers:
        """{hook: Tensor[b, ...]} (a ``run_with_cache`` cache) -> {hook: ndarray[b, ...]} in the stored form."""
        return {h: self.select(h, cache[h]).to(self.torch_dtype).contiguous().cpu().numpy() for h in self.hooks}

    def per_image_shapes(self, model, input_size: Tuple[int, int]) -> Dict[str, Tuple[int, ...]]:
        """Stored shape of one image's activation for each hook (one probe forward of a blank image).

        Raises:
            CacheError: a hook did not fire (e.g. ``hook_selective_votes`` without its intervention).
        """
        p = next(model.parameters())
        x = torch.zeros(1, model.family.in_chans, *input_size, device=p.device, dtype=p.dtype)
        # One image is all small ops; on a busy CPU, thread barriers make it ~10x slower than one thread.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                _, cache = model.run_with_cache(x, names_filter=self.hooks)
        finally:
            torch.set_num_threads(threads)
        self.check_fired(set(cache))
        return {h: tuple(a.shape[1:]) for h, a in self(cache).items()}


class BufferPool:
    """Reused batch buffers {hook: ndarray[batch_size, *shape]}: a cache run touches the same memory for
    every batch instead of allocating (and page-faulting) fresh arrays. ``acquire`` hands out a free set
    (allocating one only when none is free); ``release`` returns it once its rows are written."""

    def __init__(self, shapes: Dict[str, Tuple[int, ...]], dtype: np.dtype, batch_size: int):
        self.shapes, self.dtype, self.batch_size = shapes, dtype, batch_size
        self._free: "queue.SimpleQueue[Buffers]" = queue.SimpleQueue()

    def acquire(self) -> Buffers:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            return {h: np.empty((self.batch_size, *s), dtype=self.dtype) for h, s in self.shapes.items()}

    def release(self, buffers: Buffers) -> None:
        self._free.put(buffers)
