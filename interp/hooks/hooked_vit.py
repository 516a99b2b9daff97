"""HookedViT: a transformer-lens ``HookedRootModule`` over any supported timm VisionTransformer.

The timm module is instrumented in place: its children and root parameters are adopted (shared, not
copied) so ``HookedViT.state_dict()`` has exactly timm's keys, and ``HookPoint``s are added inside each
block under TransformerLens-style names (``blocks.3.mlp.hook_post``; no wrapper prefix). The forward is
split as timm's is: ``forward_features`` (images -> normed tokens) and ``forward_head`` (tokens -> logits).

>>> model = interp.load("vit_small_patch16_224", pretrained=False, depth=2)
>>> logits, cache = model.run_with_cache(torch.randn(2, 3, 224, 224), names_filter="blocks.*.hook_resid_post")
>>> cache["blocks.1.hook_resid_post"].shape   # [b, t, d]: CLS + 14 x 14 patches, width 384
torch.Size([2, 197, 384])
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from ..models.layout import TokenLayout, read_layout
from ..models.support import check_supported
from .adoption import AdoptsTimmRoot
from .edit_state import EditState
from .hook_registry import HookRegistry
from .inputs import check_image_batch, model_img_size
from .intervene import InterventionMixin
from .names import EMBEDDING_HOOKS, block_hook
from .points import BLOCK_HOOK_ORDER, block_forward, install

ROOT_HOOKS_BEFORE = EMBEDDING_HOOKS
ROOT_HOOKS_AFTER = ("hook_norm_final", "hook_selective_votes", "hook_pooled", "hook_logits")


class HookedViT(InterventionMixin, HookRegistry, AdoptsTimmRoot, HookedRootModule):
    """A timm ViT with hook points on every block.

    Hook names (shapes for batch b, tokens t = prefix + patches, P patches, width d, heads h):
    ``hook_patch_embed`` [b, P, d] (the patch embedding's output, before prefix tokens and position embedding),
    ``hook_embed`` [b, t, d]; per block i: ``blocks.{i}.hook_resid_pre`` [b, t, d],
    ``blocks.{i}.attn.hook_q|hook_k|hook_v|hook_z`` [b, t, h, dh],
    ``blocks.{i}.attn.hook_attn_scores|hook_pattern`` [b, h, t, t] (computed only when hooked),
    ``blocks.{i}.hook_attn_out`` / ``hook_resid_mid`` / ``hook_mlp_out`` / ``hook_resid_post`` [b, t, d],
    ``blocks.{i}.mlp.hook_pre`` / ``hook_post`` [b, t, d_mlp]; then ``hook_norm_final`` [b, t, d],
    ``hook_pooled`` [b, d'] (the vector the head sees) and ``hook_logits`` [b, n_classes].
    ``hook_selective_votes`` [b, n_patches] fires only while a pooling override (``SelectiveCLS``) is active.

    Attributes:
        timm_model: the instrumented timm module (not a submodule, so state dict keys have no prefix).
        edit_state: the structural edits in force (:class:`EditState`); only ``intervene`` changes it.
        force_patterns: compute attention patterns even when unhooked (e.g. for nnsight observers).
        init_seed: seed of the random weights ``interp.load(..., pretrained=False)`` built (None otherwise).
        pos_resample: how the weights' position table was resampled to this size (``"timm"``, ``"dinov2"``,
            ``"dinov2_reg"``; None when it was not).
    """

    def __init__(self, timm_model: nn.Module, name: Optional[str] = None):
        super().__init__()
        check_supported(timm_model)
        object.__setattr__(self, "timm_model", timm_model)  # not a submodule: no key prefix
        self.model_name = name or getattr(timm_model, "pretrained_cfg", {}).get("architecture") or type(
            timm_model).__name__
        self._adopt_timm_root()
        for block in timm_model.blocks:
            install(block)
        for key in ROOT_HOOKS_BEFORE + ROOT_HOOKS_AFTER:
            self.add_module(key, HookPoint())
        self.edit_state = EditState()
        self.force_patterns = False
        self.init_seed = getattr(timm_model, "interp_init_seed", None)
        self.pos_resample = getattr(timm_model, "interp_pos_resample", None)
        self._input_hw: Optional[Tuple[int, int]] = None
        self._index_hook_points(self._firing_order())
        self.eval()

    @classmethod
    def from_timm(cls, module: nn.Module, name: Optional[str] = None) -> "HookedViT":
        """Instrument an existing timm ViT in place (its parameters are shared, not copied)."""
        return cls(module, name=name)

    def _firing_order(self) -> List[str]:
        """Every hook name in the order the hooks fire."""
        names = list(ROOT_HOOKS_BEFORE)
        for i in range(len(self.timm_model.blocks)):
            names += [block_hook(i, rel) for rel in BLOCK_HOOK_ORDER]
        return names + list(ROOT_HOOKS_AFTER)

    def _after_apply(self, fn) -> None:
        """Device/dtype moves carry the extra key/values of an active attention-bias edit along."""
        self.edit_state = self.edit_state.map_tensors(fn)

    # ------------------------------------------------------------------ layout and sizes
    @property
    def base_layout(self) -> TokenLayout:
        """The model's own token layout (no test-time registers) for the last input size."""
        return read_layout(self.timm_model, self._input_hw)

    @property
    def layout(self) -> TokenLayout:
        """Token layout for the last input size (the model's default size before any forward)."""
        return self.base_layout.with_extra(self.edit_state.n_extra_tokens)

    def layout_for(self, img_size: Tuple[int, int]) -> TokenLayout:
        return read_layout(self.timm_model, tuple(img_size)).with_extra(self.edit_state.n_extra_tokens)

    @property
    def img_size(self) -> Tuple[int, int]:
        return model_img_size(self.timm_model)

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

    def neuron_writes(self, layer: int) -> torch.Tensor:
        """What each MLP neuron of block ``layer`` adds to the residual stream per unit of activation:
        Tensor[d_model, d_mlp], ``fc2``'s columns times the block's LayerScale (``gamma * fc2[:, n]`` where the
        block has one, as DINOv2 and DeiT-III do; ``fc2[:, n]`` otherwise). Detached float32 on the model's device.
        """
        block = self.timm_model.blocks[layer]
        w = block.mlp.fc2.weight.detach().float()
        gamma = getattr(block.ls2, "gamma", None)
        return w if gamma is None else w * gamma.detach().float()[:, None]

    # ------------------------------------------------------------------ forward
    def check_input(self, x: torch.Tensor) -> None:
        """Raise :class:`~interp.errors.ImageError` for a batch this model cannot take."""
        check_image_batch(x, self.timm_model, self.model_name)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images [b, 3, H, W] -> token sequence [b, t, d] after pos-embed, test-time registers and norm_pre."""
        m = self.timm_model
        x = m.patch_drop(m._pos_embed(self._patch_embed(x)))
        n_extra = self.edit_state.n_extra_tokens
        if n_extra:
            n_prefix = m.num_prefix_tokens
            zeros = x.new_zeros(x.shape[0], n_extra, x.shape[-1])
            x = torch.cat([x[:, :n_prefix], zeros, x[:, n_prefix:]], dim=1)
        return self.hook_embed(m.norm_pre(x))

    def _patch_embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> timm's patch embedding, through ``hook_patch_embed`` as [b, P, d] (row-major patches).

        With ``dynamic_img_size`` timm's patch embedding returns [b, h, w, d]; the hook sees it flattened and
        what it returns is put back in that shape for ``_pos_embed``."""
        e = self.timm_model.patch_embed(x)
        if e.ndim == 4:
            b, h, w, d = e.shape
            return self.hook_patch_embed(e.reshape(b, h * w, d)).reshape(b, h, w, d)
        return self.hook_patch_embed(e)

    def _residual_stream(self, x: torch.Tensor, n_blocks: Optional[int] = None) -> torch.Tensor:
        """Images [b, 3, H, W] -> residual stream [b, t, d] after blocks ``[0, n_blocks)`` (all by default)."""
        self.check_input(x)
        self._input_hw = tuple(x.shape[-2:])
        blocks = self.timm_model.blocks if n_blocks is None else self.timm_model.blocks[:n_blocks]
        h = self.embed(x)
        extra_kv, force = self.edit_state.extra_kv, self.force_patterns
        for i, block in enumerate(blocks):
            h = block_forward(block, h, extra_kv.get(i), force)
        return h

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images [b, 3, H, W] -> final normed tokens [b, t, d] (``hook_norm_final``), as timm's."""
        return self.hook_norm_final(self.timm_model.norm(self._residual_stream(x)))

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """Normed tokens [b, t, d] -> pooled [b, d']: timm's own ``pool`` unless an edit is active.

        With a pooling override (``SelectiveCLS``) it gets the patch tokens and its votes go to
        ``hook_selective_votes``; with test-time registers timm's pooling runs with them counted as prefix
        tokens (so they stay out of patch averages).
        """
        from timm.layers import global_pool_nlc

        m, state = self.timm_model, self.edit_state
        if state.pool_override is None and not state.n_extra_tokens:
            return m.pool(tokens)
        n_prefix = self.layout.n_prefix
        if state.pool_override is not None:
            pooled, votes = state.pool_override(tokens[:, n_prefix:])
            if votes is not None:
                self.hook_selective_votes(votes)
            return pooled
        if m.attn_pool is not None:
            return m.attn_pool(tokens if m.pool_include_prefix else tokens[:, n_prefix:])
        return global_pool_nlc(tokens, pool_type=m.global_pool, num_prefix_tokens=n_prefix,
                               reduce_include_prefix=m.pool_include_prefix)

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Normed tokens [b, t, d] -> logits [b, n_classes], or the pooled vector [b, d'] with ``pre_logits``.

        timm's ``forward_head`` order: pool, ``fc_norm`` (-> ``hook_pooled``), ``head_drop``, ``head``
        (-> ``hook_logits``).
        """
        m = self.timm_model
        pooled = m.head_drop(self.hook_pooled(m.fc_norm(self.pool(tokens))))
        return pooled if pre_logits else self.hook_logits(m.head(pooled))

    def forward(self, x: torch.Tensor, stop_at_layer: Optional[int] = None) -> torch.Tensor:
        """Images [b, 3, H, W] -> logits [b, n_classes] (or pooled features when the head is Identity).

        Args:
            stop_at_layer: run only blocks ``[0, stop_at_layer)`` and return the residual stream [b, t, d]
                (before the final norm).
        """
        if stop_at_layer is not None:
            return self._residual_stream(x, stop_at_layer)
        return self.forward_head(self.forward_features(x))

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
