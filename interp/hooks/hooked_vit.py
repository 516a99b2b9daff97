"""HookedViT: a transformer-lens ``HookedRootModule`` over any supported timm VisionTransformer.

The timm module is instrumented in place: its children and root parameters are adopted (shared, not
copied) so ``HookedViT.state_dict()`` has exactly timm's keys, and ``HookPoint``s are added inside each
block under TransformerLens-style names (``blocks.3.mlp.hook_post``; no wrapper prefix).

>>> import interp
>>> model = interp.load("vit_small_patch16_224", pretrained=False)
>>> logits, cache = model.run_with_cache(images, names_filter="blocks.*.hook_resid_post")
>>> cache["blocks.11.hook_resid_post"].shape   # [b, t, d]
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from ..errors import ImageError
from ..models.layout import TokenLayout, read_layout
from ..models.support import check_supported
from . import names as hook_names_mod
from .intervene import InterventionMixin
from .points import BLOCK_HOOK_ORDER, block_forward, install

ROOT_HOOKS_BEFORE = ("hook_embed",)
ROOT_HOOKS_AFTER = ("hook_norm_final", "hook_selective_votes", "hook_pooled", "hook_logits")


class HookedViT(InterventionMixin, HookedRootModule):
    """A timm ViT with hook points on every block.

    Hook names (shapes for batch b, tokens t = prefix + patches, width d, heads h):
    ``hook_embed`` [b, t, d]; per block i: ``blocks.{i}.hook_resid_pre`` [b, t, d],
    ``blocks.{i}.attn.hook_q|hook_k|hook_v|hook_z`` [b, t, h, dh],
    ``blocks.{i}.attn.hook_attn_scores|hook_pattern`` [b, h, t, t] (computed only when hooked),
    ``blocks.{i}.hook_attn_out`` / ``hook_resid_mid`` / ``hook_mlp_out`` / ``hook_resid_post`` [b, t, d],
    ``blocks.{i}.mlp.hook_pre`` / ``hook_post`` [b, t, d_mlp]; then ``hook_norm_final`` [b, t, d],
    ``hook_pooled`` [b, d'] (the vector the head sees) and ``hook_logits`` [b, n_classes].
    ``hook_selective_votes`` [b, n_patches] fires only while a pooling override (``SelectiveCLS``) is active.
    """

    def __init__(self, timm_model: nn.Module, name: Optional[str] = None):
        super().__init__()
        check_supported(timm_model)
        object.__setattr__(self, "timm_model", timm_model)  # not a submodule: no key prefix
        self.model_name = name or getattr(timm_model, "pretrained_cfg", {}).get("architecture") or type(
            timm_model).__name__
        # Adopt the timm root's own parameters and children (same objects) so the state dict matches timm.
        for key, param in timm_model._parameters.items():
            if param is not None:
                self.register_parameter(key, param)
        for key, buf in timm_model._buffers.items():
            if buf is not None:
                self.register_buffer(key, buf, persistent=key not in timm_model._non_persistent_buffers_set)
        for key, child in timm_model.named_children():
            self.add_module(key, child)
        for block in timm_model.blocks:
            install(block)
        for key in ROOT_HOOKS_BEFORE + ROOT_HOOKS_AFTER:
            self.add_module(key, HookPoint())

        self.planted = getattr(timm_model, "planted", None)  # ground truth of interp.models.planted_vit
        self.n_extra_tokens = 0  # test-time registers inserted after the prefix tokens
        self.extra_kv: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # block -> (k', v') [h, m, dh]
        self.force_patterns = False  # compute attention patterns even when unhooked (e.g. for nnsight)
        # Replaces timm's pooling: patch tokens [b, n, d] -> (pooled [b, d], votes [b, n] or None).
        self.pool_override: Optional[Callable[[torch.Tensor], Tuple[torch.Tensor, Optional[torch.Tensor]]]] = None
        self._input_hw: Optional[Tuple[int, int]] = None
        self.setup()
        self.eval()

    @classmethod
    def from_timm(cls, module: nn.Module, name: Optional[str] = None) -> "HookedViT":
        """Instrument an existing timm ViT in place (its parameters are shared, not copied)."""
        return cls(module, name=name)

    # ------------------------------------------------------------------ hook registry
    def setup(self) -> None:
        """Name the hook points and register them in forward order (only hook points are in mod_dict)."""
        ordered: List[Tuple[str, HookPoint]] = [(n, getattr(self, n)) for n in ROOT_HOOKS_BEFORE]
        for i, block in enumerate(self.timm_model.blocks):
            for rel in BLOCK_HOOK_ORDER:
                ordered.append((f"blocks.{i}.{rel}", block.get_submodule(rel)))
        ordered += [(n, getattr(self, n)) for n in ROOT_HOOKS_AFTER]
        self.hook_dict = {}
        for key, hp in ordered:
            hp.name = key
            self.hook_dict[key] = hp
        self.mod_dict = dict(self.hook_dict)

    def hook_names(self) -> List[str]:
        """Every hook name, in the order the hooks fire."""
        return list(self.hook_dict)

    def resolve_hooks(self, spec: hook_names_mod.NamesSpec) -> List[str]:
        """Hook names selected by an exact name, a glob pattern, a list of those, or a callable."""
        return hook_names_mod.resolve(spec, self.hook_names())

    def _enable_hook(self, name, hook, dir):
        if isinstance(name, str):
            for key in hook_names_mod.match(name, self.hook_names()):
                self.hook_dict[key].add_hook(hook, dir=dir, level=self.context_level)
        else:
            super()._enable_hook(name, hook, dir)

    def add_hook(self, name, hook, dir="fwd", is_permanent=False, level=None, prepend=False):
        if isinstance(name, str):
            for key in hook_names_mod.match(name, self.hook_names()):
                self.check_and_add_hook(self.hook_dict[key], key, hook, dir=dir, is_permanent=is_permanent,
                                        level=level, prepend=prepend)
        else:
            super().add_hook(name, hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def get_caching_hooks(self, names_filter=None, *args, **kwargs):
        if names_filter is not None and not callable(names_filter):
            names_filter = self.resolve_hooks(names_filter)
        return super().get_caching_hooks(names_filter, *args, **kwargs)

    # ------------------------------------------------------------------ layout
    @property
    def base_layout(self) -> TokenLayout:
        return read_layout(self.timm_model, self._input_hw)

    @property
    def layout(self) -> TokenLayout:
        """Token layout for the last input size (the model's default size before any forward)."""
        return self.base_layout.with_extra(self.n_extra_tokens)

    def layout_for(self, img_size: Tuple[int, int]) -> TokenLayout:
        return read_layout(self.timm_model, tuple(img_size)).with_extra(self.n_extra_tokens)

    @property
    def img_size(self) -> Tuple[int, int]:
        return tuple(int(s) for s in self.timm_model.patch_embed.img_size)

    @property
    def n_layers(self) -> int:
        return len(self.timm_model.blocks)

    @property
    def d_model(self) -> int:
        return int(self.timm_model.embed_dim)

    @property
    def d_mlp(self) -> int:
        return int(self.timm_model.blocks[0].mlp.fc2.in_features)

    @property
    def n_heads(self) -> int:
        return int(self.timm_model.blocks[0].attn.num_heads)

    def _apply(self, fn, recurse=True):
        # Convert through the timm module (children are shared) and re-link the adopted root tensors.
        self.timm_model._apply(fn, recurse)
        for key in list(self._parameters):
            self._parameters[key] = self.timm_model._parameters[key]
        for key in list(self._buffers):
            self._buffers[key] = self.timm_model._buffers[key]
        for key, child in self._modules.items():
            if key not in self.timm_model._modules and child is not None:
                child._apply(fn, recurse)
        self.extra_kv = {i: (fn(k), fn(v)) for i, (k, v) in self.extra_kv.items()}
        return self

    # ------------------------------------------------------------------ forward
    def check_input(self, x: torch.Tensor) -> None:
        """Raise :class:`ImageError` for a batch this model cannot take."""
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise ImageError(
                f"expected an image batch Tensor[B, C, H, W], got {getattr(x, 'shape', type(x))}; "
                "use interp.load_images(paths, model) to read files"
            )
        pe = self.timm_model.patch_embed
        in_chans = pe.proj.in_channels
        if x.shape[1] != in_chans:
            raise ImageError(f"model takes {in_chans}-channel images, got {x.shape[1]} channels "
                             "(interp.load_images converts grayscale/RGBA files to RGB)")
        hw = tuple(x.shape[-2:])
        if getattr(self.timm_model, "dynamic_img_size", False) or not getattr(pe, "strict_img_size", True):
            ph, pw = pe.patch_size
            if not getattr(pe, "dynamic_img_pad", False) and (hw[0] % ph or hw[1] % pw):
                raise ImageError(f"image size {hw} is not a multiple of the patch size {(ph, pw)}")
            return
        if hw != self.img_size:
            raise ImageError(
                f"model {self.model_name} takes {self.img_size[0]}x{self.img_size[1]} images, got "
                f"{hw[0]}x{hw[1]}. Resize with interp.load_images(paths, model) (the model's own "
                "preprocessing), or load the model with dynamic_img_size=True to interpolate position embeddings."
            )

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images [b, 3, H, W] -> token sequence [b, t, d] after pos-embed, extra tokens and norm_pre."""
        m = self.timm_model
        x = m.patch_embed(x)
        x = m._pos_embed(x)
        x = m.patch_drop(x)
        if self.n_extra_tokens:
            n_prefix = m.num_prefix_tokens
            zeros = x.new_zeros(x.shape[0], self.n_extra_tokens, x.shape[-1])
            x = torch.cat([x[:, :n_prefix], zeros, x[:, n_prefix:]], dim=1)
        x = m.norm_pre(x)
        return self.hook_embed(x)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """timm's pooling with the current prefix count (test-time registers stay out of averages)."""
        from timm.layers import global_pool_nlc

        m = self.timm_model
        n_prefix = self.layout.n_prefix
        if self.pool_override is not None:
            pooled, votes = self.pool_override(x[:, n_prefix:])
            if votes is not None:
                self.hook_selective_votes(votes)
            return pooled
        if m.attn_pool is not None:
            if not m.pool_include_prefix:
                x = x[:, n_prefix:]
            return m.attn_pool(x)
        return global_pool_nlc(x, pool_type=m.global_pool, num_prefix_tokens=n_prefix,
                               reduce_include_prefix=m.pool_include_prefix)

    def forward(self, x: torch.Tensor, stop_at_layer: Optional[int] = None) -> torch.Tensor:
        """Images [b, 3, H, W] -> logits [b, n_classes] (or pooled features when the head is Identity).

        Args:
            stop_at_layer: run only blocks ``[0, stop_at_layer)`` and return the residual stream [b, t, d].
        """
        self.check_input(x)
        self._input_hw = tuple(x.shape[-2:])
        m = self.timm_model
        h = self.embed(x)
        blocks = m.blocks if stop_at_layer is None else m.blocks[:stop_at_layer]
        for i, block in enumerate(blocks):
            h = block_forward(block, h, self.extra_kv.get(i), self.force_patterns)
        if stop_at_layer is not None:
            return h
        h = self.hook_norm_final(m.norm(h))
        pooled = self.hook_pooled(m.fc_norm(self.pool(h)))
        return self.hook_logits(m.head(m.head_drop(pooled)))

    # ------------------------------------------------------------------ introspection
    @torch.no_grad()
    def hook_shapes(self, img_size: Optional[Tuple[int, int]] = None, batch_size: int = 1) -> Dict[str, Tuple[int, ...]]:
        """Shape of every hook for an input of ``img_size`` (default: the model's), patterns included."""
        hw = tuple(img_size) if img_size is not None else self.img_size
        p = next(self.parameters())
        x = torch.zeros(batch_size, self.timm_model.patch_embed.proj.in_channels, *hw, device=p.device, dtype=p.dtype)
        shapes: Dict[str, Tuple[int, ...]] = {}

        def record(tensor, hook):
            shapes[hook.name] = tuple(tensor.shape)

        self.run_with_hooks(x, fwd_hooks=[(lambda n: True, record)])
        return {n: shapes[n] for n in self.hook_names() if n in shapes}

    def __repr__(self) -> str:
        lay = self.layout
        return (f"HookedViT({self.model_name}: {self.n_layers} blocks, d={self.d_model}, heads={self.n_heads}, "
                f"prefix={lay.n_prefix} (registers={lay.n_registers}), grid={lay.grid}, "
                f"{len(self.hook_dict)} hook points)")
