"""A model family added from outside the package: timm's distilled DeiT (``VisionTransformerDistilled``,
``deit_*_distilled_*``), whose tokens are ``[CLS, DIST, patches]`` and whose head averages a head on CLS and a
second head on the distillation token. interp's ViT family refuses it (the class overrides ``_pos_embed`` and
``forward_head``); this script adds an adapter with ``interp.register_family`` and checks every block's hooks
against timm's own forward.

    python examples/deit_distilled.py
"""
from dataclasses import replace

import timm
import torch
from timm.models.deit import VisionTransformerDistilled

import interp
from interp.errors import InterpError
from interp.models.families import VitFamily


class DeitDistilledFamily(VitFamily):
    """timm's ``VisionTransformerDistilled``: the ViT family's blocks and hook points (its ``embed`` already calls
    the model's own ``_pos_embed``, which inserts the distillation token), a layout with the distillation token at
    row 1, and the distilled head."""

    name = "deit_distilled"
    title = "timm VisionTransformerDistilled: distilled DeiT (deit_*_distilled_*), added by examples/deit_distilled.py"
    timm_modules = ()  # the names are timm.models.deit's, which the ViT family checks before a build

    @classmethod
    def timm_class(cls) -> type:
        return VisionTransformerDistilled

    def layout(self, img_size=None):
        return replace(super().layout(img_size), dist_index=1)  # [CLS, DIST, patches]: 2 prefix tokens, 0 registers

    def check_edits(self, state) -> None:
        super().check_edits(state)
        if state.pool_override is not None:
            raise InterpError("a pooling override (SelectiveCLS) is not defined for distilled DeiT: its head reads "
                              "the CLS and distillation tokens")

    def forward_head(self, hooked, tokens, pre_logits=False):
        """timm's distilled head: ``hook_pooled`` is (CLS + DIST) / 2 (timm's ``pre_logits``); the logits average
        ``head(CLS)`` and ``head_dist(DIST)``, read from the two tokens (an edit of ``hook_pooled`` does not reach
        them)."""
        m = self.module
        self.check_edits(hooked.edit_state)
        x, x_dist = m.head_drop(tokens[:, 0]), m.head_drop(tokens[:, 1])
        pooled = hooked.hook_pooled((x + x_dist) / 2)
        if pre_logits:
            return pooled
        return hooked.hook_logits((m.head(x) + m.head_dist(x_dist)) / 2)

    def plain_pool(self, pool):
        raise InterpError("patch files cannot replace the pooling of distilled DeiT: its head reads two tokens")


interp.register_family(DeitDistilledFamily)

if __name__ == "__main__":
    name = "deit_tiny_distilled_patch16_224"
    timm_model = timm.create_model(name, pretrained=False, depth=3).eval()  # random weights: runs offline
    model = interp.HookedViT.from_timm(timm_model, name=name)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    names = [model.block_names.hook(i, "hook_resid_post") for i in range(model.n_layers)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(x, names_filter=names)
        timm_blocks, h = [], timm_model.norm_pre(timm_model._pos_embed(timm_model.patch_embed(x)))
        for block in timm_model.blocks:
            h = block(h)
            timm_blocks.append(h)
        reference = timm_model(x)
    worst = max(float((cache[n] - t).abs().max()) for n, t in zip(names, timm_blocks))
    print(f"family: {model.family.name}; layout: {model.layout}")
    print(f"registers: {model.layout.n_registers}; distillation token row: {model.layout.dist_index}")
    print(f"blocks vs timm, max |diff|: {worst:.2e}; logits vs timm, max |diff|: "
          f"{float((logits - reference).abs().max()):.2e}")
