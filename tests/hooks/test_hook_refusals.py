"""Hooks refuse what they cannot take with one clear error line."""
from __future__ import annotations


import pytest
import torch


from conftest import make_model


# ------------------------------------------------------------------------------------------ hooks
def test_hook_returning_the_wrong_shape_names_hook_and_shape():
    from interp.errors import HookShapeError

    model = make_model("vit")

    def first_ten(act, hook):
        return act[..., :10]

    with pytest.raises(HookShapeError, match=r"'first_ten' on blocks\.1\.mlp\.hook_post returned shape "
                                             r"\[1, 197, 10\], but blocks\.1\.mlp\.hook_post carries \[1, 197, 1536\]"):
        model.run_with_hooks(torch.randn(1, 3, 224, 224), fwd_hooks=[("blocks.1.mlp.hook_post", first_ten)])
    with pytest.raises(HookShapeError):
        with model.hooks(fwd_hooks=[("blocks.*.hook_resid_post", lambda a, hook: a[:, :5])]):
            model(torch.randn(1, 3, 224, 224))
    model.run_with_hooks(torch.randn(1, 3, 224, 224), fwd_hooks=[("blocks.1.mlp.hook_post", lambda a, hook: None)])


def test_block_out_of_range_states_the_valid_range():
    from interp.errors import HookNameError

    model = make_model("vit")  # 2 blocks
    with pytest.raises(HookNameError, match=r"block 12 does not exist, this model has 2 blocks \(0-1\)"):
        model.run_with_hooks(torch.randn(1, 3, 224, 224), fwd_hooks=[("blocks.12.hook_resid_post", print)])


def test_transformer_lens_style_cache_keys():
    from interp.errors import HookNameError

    model = make_model("vit")
    _, cache = model.run_with_cache(torch.randn(1, 3, 224, 224))
    assert torch.equal(cache["resid_post", 1], cache["blocks.1.hook_resid_post"])
    assert torch.equal(cache["q", -1], cache["blocks.1.attn.hook_q"])
    assert torch.equal(cache["post", 0], cache["blocks.0.mlp.hook_post"])
    assert torch.equal(cache["pattern", 0], cache["blocks.0.attn.hook_pattern"])
    assert torch.equal(cache["embed",], cache["hook_embed"])
    for key, message in ((("resid_post", 5), r"block 5 does not exist.*2 blocks"), (("resid_pots", 1), "resid_post"),
                         (("resid_post",), "give its block")):
        with pytest.raises(HookNameError, match=message):
            cache[key]
