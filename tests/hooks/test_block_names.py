"""Block names and per-stage layouts: the spelling every model family's hook names share, and the grid of each
block's tokens (pyramid stages run on their own grids)."""
from __future__ import annotations

import pytest

from interp.errors import HookNameError
from interp.hooks.names import BlockNames, resid_post
from interp.models.layout import TokenLayout

PVT = BlockNames(("stages.0.blocks.0", "stages.0.blocks.1", "stages.1.blocks.0", "stages.2.blocks.0"))


def test_flat_names_are_the_module_level_builders():
    flat = BlockNames.flat(3)
    assert flat.resid_post(2) == resid_post(2) and flat.resid_post(-1) == resid_post(2)
    assert flat.block_of("blocks.1.attn.hook_q") == 1 and flat.block_of("hook_logits") is None
    assert not flat.staged and flat.label(1) == "block 1" and flat.short(1) == "1"


def test_staged_names_index_blocks_in_forward_order():
    assert PVT.staged and len(PVT) == 4
    assert PVT.mlp_post(2) == "stages.1.blocks.0.mlp.hook_post"
    assert PVT.block_of("stages.0.blocks.1.attn.hook_pattern") == 1
    assert PVT.block_of("blocks.1.hook_resid_post") is None  # another model's spelling is no block of this one
    assert PVT.label(3) == "stage 2 block 0" and PVT.short(-1) == "s2.b0"
    assert PVT.every("hook_resid_post")[-1] == "stages.2.blocks.0.hook_resid_post"
    assert PVT.blocks_needed(["hook_embed", "stages.1.blocks.0.hook_resid_mid"]) == 3
    assert PVT.blocks_needed(["hook_norm_final"]) is None
    with pytest.raises(HookNameError, match="4 blocks"):
        PVT.resid_post(4)


def test_block_names_read_back_from_hook_names():
    hooks = ["hook_embed"] + [f"{p}.{leaf}" for p in PVT.prefixes for leaf in ("hook_resid_pre", "hook_resid_post")]
    assert BlockNames.from_hooks(hooks) == PVT
    assert BlockNames.from_hooks(["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]) == BlockNames.flat(2)


def test_a_pyramid_layout_gives_each_block_its_stages_grid():
    lay = TokenLayout(n_prefix=0, n_registers=0, cls_index=None, grid=(7, 7),
                      stage_grids=((28, 28), (14, 14), (7, 7)), block_stages=(0, 0, 1, 2))
    assert lay.n_stages == 3 and lay.for_block(1).grid == (28, 28) and lay.for_block(-1).grid == (7, 7)
    assert lay.for_block(2).n_patches == 196 and lay.for_block(2).patch_slice == slice(0, 196)
    assert PVT.layout_of(lay, "hook_embed").grid == (28, 28)            # the embedding feeds the first stage
    assert PVT.layout_of(lay, "hook_norm_final").grid == (7, 7)         # the final tokens are the last stage's
    assert PVT.layout_of(lay, PVT.attn_q(2)).grid == (14, 14)
    assert TokenLayout.from_dict(lay.to_dict()) == lay
    vit = TokenLayout(n_prefix=1, n_registers=0, cls_index=0, grid=(14, 14))
    assert vit.for_block(5) is vit and "stage_grids" not in vit.to_dict()   # one grid: the ViT layout is unchanged
    assert TokenLayout.from_dict(vit.to_dict()) == vit
