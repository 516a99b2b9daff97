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

from ..models.families import Family, family_of
from ..models.layout import TokenLayout
from .adoption import AdoptsTimmRoot
from .edit_state import EditState
from .hook_registry import HookRegistry
from .intervene import InterventionMixin
from .names import EMBEDDING_HOOKS, BlockNames

ROOT_HOOKS_BEFORE = EMBEDDING_HOOKS
ROOT_HOOKS_AFTER = ("hook_norm_final", "hook_selective_votes", "hook_pooled", "hook_logits")


class HookedViT(InterventionMixin, HookRegistry, AdoptsTimmRoot, HookedRootModule):
    """A timm vision transformer with hook points on every block.

    Every model family interp instruments (:mod:`interp.models.families`: ViT, ...) is a ``HookedViT``; its
    family adapter (``model.family``) knows the blocks, the token layout and the hooked forward.

    Hook names (shapes for batch b, tokens t = prefix + patches, P patches, width d, heads h); a block's prefix
    is its module path in timm (``model.block_names``: ``blocks.{i}`` in a ViT):
    ``hook_patch_embed`` [b, P, d] (the patch embedding's output, before prefix tokens and position embedding),
    ``hook_embed`` [b, t, d]; per block i: ``blocks.{i}.hook_resid_pre`` [b, t, d],
    ``blocks.{i}.attn.hook_q|hook_k|hook_v|hook_z`` [b, t, h, dh],
    ``blocks.{i}.attn.hook_attn_scores|hook_pattern`` [b, h, t, t] (computed only when hooked),
    ``blocks.{i}.hook_attn_out`` / ``hook_resid_mid`` / ``hook_mlp_out`` / ``hook_resid_post`` [b, t, d],
    ``blocks.{i}.mlp.hook_pre`` / ``hook_post`` [b, t, d_mlp] (``mlp.hook_gate`` [b, t, d_mlp] too for a gated
    MLP); then ``hook_norm_final`` [b, t, d], ``hook_pooled`` [b, d'] (the vector the head sees) and
    ``hook_logits`` [b, n_classes]. ``hook_selective_votes`` [b, n_patches] fires only while a pooling override
    (``SelectiveCLS``) is active.

    Attributes:
        timm_model: the instrumented timm module (not a submodule, so state dict keys have no prefix).
        family: its family adapter (:class:`~interp.models.families.base.Family`).
        block_names: the hook-name prefix of every block (:class:`~interp.hooks.names.BlockNames`).
        edit_state: the structural edits in force (:class:`EditState`); only ``intervene`` changes it.
        force_patterns: compute attention patterns even when unhooked (e.g. for nnsight observers).
        init_seed: seed of the random weights ``interp.load(..., pretrained=False)`` built (None otherwise).
        pos_resample: how the weights' position table was resampled to this size (``"timm"``, ``"dinov2"``,
            ``"dinov2_reg"``, ``"transformers"``; None when it was not).
    """

    def __init__(self, timm_model: nn.Module, name: Optional[str] = None):
        super().__init__()
        family = family_of(timm_model)
        object.__setattr__(self, "timm_model", timm_model)  # not a submodule: no key prefix
        object.__setattr__(self, "family", family)
        self.model_name = name or getattr(timm_model, "pretrained_cfg", {}).get("architecture") or type(
            timm_model).__name__
        self._adopt_timm_root()
        family.install()
        self.block_names = BlockNames(tuple(prefix for prefix, _ in family.blocks()))
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
        for i in range(self.n_layers):
            names += [self.block_names.hook(i, leaf) for leaf in self.family.hook_leaves(i)]
        return names + list(ROOT_HOOKS_AFTER)

    def _after_apply(self, fn) -> None:
        """Device/dtype moves carry the extra key/values of an active attention-bias edit along."""
        self.edit_state = self.edit_state.map_tensors(fn)

    # ------------------------------------------------------------------ layout and sizes
    @property
    def base_layout(self) -> TokenLayout:
        """The model's own token layout (no test-time registers) for the last input size."""
        return self.family.layout(self._input_hw)

    @property
    def layout(self) -> TokenLayout:
        """Token layout for the last input size (the model's default size before any forward)."""
        return self.base_layout.with_extra(self.edit_state.n_extra_tokens)

    def layout_for(self, img_size: Tuple[int, int]) -> TokenLayout:
        return self.family.layout(tuple(img_size)).with_extra(self.edit_state.n_extra_tokens)

    @property
    def img_size(self) -> Tuple[int, int]:
        return self.family.img_size

    @property
    def patch_size(self) -> Tuple[int, int]:
        """(ph, pw): input pixels per token of the first blocks' grid."""
        return self.family.patch_size

    @property
    def n_layers(self) -> int:
        return len(self.block_names)

    @property
    def d_model(self) -> int:
        """Width of the residual stream (of the last blocks, for a pyramid model)."""
        return self.family.d_model()

    @property
    def d_mlp(self) -> int:
        """MLP neurons per block (of the first block, for a pyramid model: see ``family.d_mlp(layer)``)."""
        return self.family.d_mlp(0)

    @property
    def n_heads(self) -> int:
        return self.family.n_heads(0)

    def neuron_writes(self, layer: int, acts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """What each MLP neuron of block ``layer`` adds to the residual stream per unit of activation:
        Tensor[d_model, d_mlp], ``fc2``'s columns times the block's LayerScale (``gamma * fc2[:, n]`` where the
        block has one, as DINOv2, DeiT-III and DINOv3 do; ``fc2[:, n]`` otherwise). Detached float32. Where a
        LayerNorm sits between the neurons and the residual (EVA02's ``scale_mlp``, Swin-v2's post-norm;
        :meth:`write_note` says so), linearised at the operating point ``acts`` (``mlp.hook_post`` activations
        [..., d_mlp]), which it then needs (``Family.neuron_writes``)."""
        return self.family.neuron_writes(self.block_names.index(layer), acts)

    def write_note(self, layer: int) -> Optional[str]:
        """None where block ``layer``'s write directions are exact, else how they are linearised."""
        return self.family.write_note(self.block_names.index(layer))

    # ------------------------------------------------------------------ forward
    def check_input(self, x: torch.Tensor) -> None:
        """Raise :class:`~interp.errors.ImageError` for a batch this model cannot take."""
        self.family.check_input(x, self.model_name)

    def _residual_stream(self, x: torch.Tensor, n_blocks: Optional[int] = None) -> torch.Tensor:
        """Images [b, 3, H, W] -> residual stream [b, t, d] after blocks ``[0, n_blocks)`` (all by default)."""
        self.check_input(x)
        self._input_hw = tuple(x.shape[-2:])
        self.family.check_edits(self.edit_state)
        return self.family.residual_stream(self, x, n_blocks)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images [b, 3, H, W] -> final normed tokens [b, t, d] (``hook_norm_final``), as timm's."""
        self.check_input(x)
        self._input_hw = tuple(x.shape[-2:])
        self.family.check_edits(self.edit_state)
        return self.family.forward_features(self, x)

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Normed tokens [b, t, d] -> logits [b, n_classes], or the pooled vector [b, d'] with ``pre_logits``
        (through ``hook_pooled`` and ``hook_logits``)."""
        return self.family.forward_head(self, tokens, pre_logits)

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
        x = torch.zeros(batch_size, self.family.in_chans, *hw, device=p.device, dtype=p.dtype)
        shapes: Dict[str, Tuple[int, ...]] = {}

        def record(tensor, hook):
            shapes[hook.name] = tuple(tensor.shape)

        self.run_with_hooks(x, fwd_hooks=[(lambda n: True, record)])
        return {n: shapes[n] for n in self.hook_names() if n in shapes}

    def __repr__(self) -> str:
        lay = self.layout
        return (f"HookedViT({self.model_name}: {self.family.name}, {self.n_layers} blocks, d={self.d_model}, "
                f"heads={self.n_heads}, "
                f"prefix={lay.n_prefix} (registers={lay.n_registers}), grid={lay.grid}, "
                f"{len(self.hook_dict)} hook points)")
