"""``PlainStackFamily``: what the ViT and Eva families share. Both are one stack of blocks (``blocks.{i}``) over
``[CLS?, registers..., patches...]`` tokens (``num_prefix_tokens``) that timm builds the same way: ``patch_embed``,
``_pos_embed``, ``norm_pre``, the blocks, ``norm``, then ``pool``, ``fc_norm``, ``head_drop``, ``head``.

A subclass says what differs: its timm block and attention classes (:meth:`PlainStackFamily.block_types`),
how position enters (:meth:`PlainStackFamily.position`: a RoPE table for Eva), extra attention hook points,
where a plain model takes test-time registers, and whether an attention pool reads the prefix tokens.
"""
from __future__ import annotations

from typing import ClassVar, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ...errors import InterpError
from ..layout import TokenLayout
from .base import Family
from .parts import InsertExtraTokens, MlpActivationEdits, check_blocks, install, is_gated, unsupported_mlp
from .readout import FinalReadout, final_readout

ENTRY_POINTS = ("forward_features", "_pos_embed", "forward_head", "pool")  # timm methods the hooked forward replays


class PlainStackFamily(Family):
    """Base of :class:`~.vit.VitFamily` and :class:`~.eva.EvaFamily` (registered by neither: it has no name)."""

    # the module a plain model runs right after the position embedding (test-time registers go in after it)
    after_position: ClassVar[str] = "patch_drop"
    override_example: ClassVar[str] = ""  # a known subclass that overrides an entry point, said when refused

    def block_types(self) -> Tuple[Tuple[type, ...], Tuple[type, ...]]:
        """(block classes, attention classes) the hooked forward reproduces."""
        raise NotImplementedError

    def attention_problem(self, attn: nn.Module) -> Optional[str]:
        """Why the hooked forward cannot run this attention of an accepted class, or None."""
        return None

    def check(self) -> None:
        self.refuse_overrides(self.timm_class(), ENTRY_POINTS, self.override_example)
        blocks, attns = self.block_types()
        check_blocks(self, blocks, attns,
                     lambda block: self.attention_problem(block.attn) or unsupported_mlp(block.mlp))

    # ------------------------------------------------------------------ anatomy
    def block(self, layer: int) -> nn.Module:
        return self.module.blocks[layer]

    def grid(self, img_size: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
        """Patch grid ``(h, w)`` for an input of ``img_size`` (default: the model's own)."""
        pe = self.module.patch_embed
        if img_size is None:
            return tuple(int(g) for g in pe.grid_size)
        if hasattr(pe, "dynamic_feat_size"):
            return tuple(int(g) for g in pe.dynamic_feat_size(tuple(img_size)))
        ph, pw = pe.patch_size
        return (img_size[0] // ph, img_size[1] // pw)

    def layout(self, img_size: Optional[Tuple[int, int]] = None) -> TokenLayout:
        m = self.module
        reg = getattr(m, "reg_token", None)
        return TokenLayout(n_prefix=int(getattr(m, "num_prefix_tokens", 0)),
                           n_registers=0 if reg is None else int(reg.shape[1]),
                           cls_index=0 if getattr(m, "cls_token", None) is not None else None,
                           grid=self.grid(img_size))

    def d_model(self, layer: int = -1) -> int:
        return int(self.module.embed_dim)

    def prefix_tokens(self) -> List[nn.Parameter]:
        """timm's ``cls_token`` [1, 1, d] and ``reg_token`` [1, r, d], those the model has."""
        return [t for t in (getattr(self.module, "cls_token", None), getattr(self.module, "reg_token", None))
                if t is not None]

    def final_readout(self) -> FinalReadout:
        return final_readout(self)

    # ------------------------------------------------------------------ hook points
    def extra_attn_hooks(self) -> Tuple[str, ...]:
        """Hook points of every attention beyond the common ones, fired after ``attn.hook_v``."""
        return ()

    def hook_leaves(self, layer: int) -> Tuple[str, ...]:
        leaves = super().hook_leaves(layer)
        i = leaves.index("attn.hook_v") + 1
        leaves = leaves[:i] + tuple(f"attn.{h}" for h in self.extra_attn_hooks()) + leaves[i:]
        if is_gated(self.mlp(layer)):
            i = leaves.index("mlp.hook_post")
            leaves = leaves[:i] + ("mlp.hook_gate",) + leaves[i:]
        return leaves

    def install(self) -> None:
        for _, block in self.blocks():
            install(block, extra_attn=self.extra_attn_hooks(), extra_mlp=("hook_gate",) if is_gated(block.mlp) else ())

    # ------------------------------------------------------------------ hooked forward
    def position(self, patches: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Patch tokens [b, h*w, d] (or [b, h, w, d]) -> (all tokens [b, t, d] with prefix tokens and position
        embedding, the RoPE table or None), as timm's ``_pos_embed`` (and what follows it) computes them."""
        raise NotImplementedError

    def embed(self, hooked, x: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Images [b, C, H, W] -> (tokens [b, t, d] entering block 0, RoPE table or None): patch embedding
        (``hook_patch_embed``), prefix tokens and position embedding (:meth:`position`), test-time registers,
        ``norm_pre`` (``hook_embed``)."""
        m = self.module
        e = m.patch_embed(x)
        if e.ndim == 4:  # dynamic_img_size: [b, h, w, d]; the hook sees it flattened
            b, h, w, d = e.shape
            e = hooked.hook_patch_embed(e.reshape(b, h * w, d)).reshape(b, h, w, d)
        else:
            e = hooked.hook_patch_embed(e)
        tokens, rope = self.position(e)
        n_extra = hooked.edit_state.n_extra_tokens
        if n_extra:
            n_prefix = m.num_prefix_tokens
            zeros = tokens.new_zeros(tokens.shape[0], n_extra, tokens.shape[-1])
            tokens = torch.cat([tokens[:, :n_prefix], zeros, tokens[:, n_prefix:]], dim=1)
        return hooked.hook_embed(m.norm_pre(tokens)), rope

    def forward_features(self, hooked, x: torch.Tensor) -> torch.Tensor:
        return hooked.hook_norm_final(self.module.norm(self.residual_stream(hooked, x)))

    @property
    def attn_pool_reads_prefix(self) -> bool:
        """Whether the model's attention pool (``attn_pool``) reads the prefix tokens too."""
        return bool(getattr(self.module, "pool_include_prefix", False))

    def pool(self, hooked, tokens: torch.Tensor) -> torch.Tensor:
        """Normed tokens [b, t, d] -> pooled [b, d']: timm's own ``pool`` unless an edit is active.

        With a pooling override (``SelectiveCLS``) it gets the patch tokens and its votes go to
        ``hook_selective_votes``; with test-time registers timm's pooling runs with them counted as prefix
        tokens (so they stay out of patch averages; an attention pool reads them where it reads the prefix).
        """
        from timm.layers import global_pool_nlc

        m, state = self.module, hooked.edit_state
        if state.pool_override is None and not state.n_extra_tokens:
            return m.pool(tokens)
        n_prefix = m.num_prefix_tokens + state.n_extra_tokens
        if state.pool_override is not None:
            pooled, votes = state.pool_override(tokens[:, n_prefix:])
            if votes is not None:
                hooked.hook_selective_votes(votes)
            return pooled
        if m.attn_pool is not None:
            return m.attn_pool(tokens if self.attn_pool_reads_prefix else tokens[:, n_prefix:])
        return global_pool_nlc(tokens, pool_type=m.global_pool, num_prefix_tokens=n_prefix,
                               reduce_include_prefix=getattr(m, "pool_include_prefix", False))

    def forward_head(self, hooked, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """timm's order: pool, ``fc_norm`` (-> ``hook_pooled``), ``head_drop``, ``head`` (-> ``hook_logits``)."""
        m = self.module
        pooled = m.head_drop(hooked.hook_pooled(m.fc_norm(self.pool(hooked, tokens))))
        return pooled if pre_logits else hooked.hook_logits(m.head(pooled))

    # ------------------------------------------------------------------ plain timm models
    def plain_mlp_edits(self, layer: int, edits: Sequence[nn.Module]) -> None:
        mlp = self.mlp(layer)
        mlp.drop1 = MlpActivationEdits(edits, mlp.drop1)

    def plain_extra_tokens(self, n_extra: int) -> None:
        """Zero tokens after the prefix, inserted after the position embedding (:attr:`after_position`), so they
        get none; timm's pooling then counts them as prefix tokens."""
        m = self.module
        if getattr(m, "dynamic_img_size", False) and m.pos_embed is not None and not m.no_embed_class:
            raise InterpError("test-time registers in a plain model with dynamic_img_size=True and a position "
                              "embedding that covers the prefix tokens are not supported (timm resamples it with "
                              "num_prefix_tokens); build the model without dynamic_img_size, or use the hooked model")
        setattr(m, self.after_position,
                InsertExtraTokens(getattr(m, self.after_position), m.num_prefix_tokens, n_extra))
        m.num_prefix_tokens = m.num_prefix_tokens + n_extra

    def plain_pool(self, pool: nn.Module) -> None:
        if getattr(self.module, "attn_pool", None) is not None:
            raise InterpError("SelectiveCLS on a model with attention pooling (attn_pool, e.g. Perception Encoder) "
                              "would drop the pooling weights from the state dict; use the hooked model instead")
        self.module.attn_pool = pool

    def pool_skip(self, n_extra: int) -> int:
        """How many leading rows an attention pool that reads the prefix tokens must skip."""
        return int(self.module.num_prefix_tokens) + n_extra if self.attn_pool_reads_prefix else 0
