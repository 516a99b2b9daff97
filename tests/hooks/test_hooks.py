"""Hook-point layer: parity with timm (per layer, fused and unfused), names, shapes, hook semantics."""
from __future__ import annotations

import pytest
import timm
import torch

import interp
from interp.errors import HookNameError

from conftest import images, make_model

TOL = 1e-5


def timm_reference(model, x):
    """Logits and per-block residual streams (prefix tokens included, before the final norm) from timm."""
    tm = model.timm_model
    with torch.no_grad():
        final, inter = tm.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC")
        logits = tm.forward_head(final)
    return logits, [torch.cat([prefix, spatial], dim=1) for spatial, prefix in inter]


def assert_parity(model, x, cache_filter):
    logits_ref, resid_ref = timm_reference(model, x)
    with torch.no_grad():
        logits, cache = model.run_with_cache(x, names_filter=cache_filter)
    assert (logits - logits_ref).abs().max().item() <= TOL
    for i, ref in enumerate(resid_ref):
        got = cache[f"blocks.{i}.hook_resid_post"]
        assert got.shape == ref.shape
        assert (got - ref).abs().max().item() <= TOL, f"block {i}"
    return cache


def test_parity_with_timm_every_family(family):
    model = make_model(family)
    x = images(2)
    assert_parity(model, x, "blocks.*.hook_resid_post")


def test_parity_full_depth_dinov2_reg_and_clip_quickgelu():
    for name, kwargs in [("vit_small_patch14_reg4_dinov2", dict(img_size=224)),
                         ("vit_base_patch16_clip_quickgelu_224", dict(depth=4))]:
        torch.manual_seed(0)
        model = interp.load(name, pretrained=False, **kwargs)
        assert_parity(model, images(1), "blocks.*.hook_resid_post")


def test_parity_unfused_when_patterns_requested(family):
    """With pattern hooks the attention runs unfused and must equal timm with fused_attn disabled."""
    model = make_model(family)
    x = images(2)
    for block in model.timm_model.blocks:
        block.attn.fused_attn = False
    try:
        cache = assert_parity(model, x, lambda n: n.endswith(("hook_resid_post", "hook_pattern")))
    finally:
        for block in model.timm_model.blocks:
            block.attn.fused_attn = True
    pattern = cache["blocks.1.attn.hook_pattern"]
    t = model.layout.n_tokens
    assert pattern.shape == (2, model.n_heads, t, t)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, model.n_heads, t), atol=1e-5, rtol=0)


def test_pattern_equals_manual_softmax_of_q_k():
    model = make_model("vit")
    x = images(1)
    _, cache = model.run_with_cache(x, names_filter=["blocks.0.attn.hook_q", "blocks.0.attn.hook_k",
                                                     "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_attn_scores"])
    q = cache["blocks.0.attn.hook_q"].transpose(1, 2)  # [b, h, t, dh]
    k = cache["blocks.0.attn.hook_k"].transpose(1, 2)
    scores = (q * model.timm_model.blocks[0].attn.scale) @ k.transpose(-2, -1)
    torch.testing.assert_close(cache["blocks.0.attn.hook_attn_scores"], scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"], scores.softmax(-1), atol=1e-6, rtol=1e-5)


def test_fused_kernel_kept_when_no_pattern_hook(monkeypatch):
    """Per block: only blocks whose pattern is hooked take the unfused path."""
    import interp.models.families.parts as points

    calls = []
    real = points.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(points.F, "scaled_dot_product_attention", spy)
    model = make_model("vit")
    model.run_with_cache(images(1), names_filter="blocks.0.attn.hook_pattern")
    assert len(calls) == model.n_layers - 1
    calls.clear()
    model(images(1))
    assert len(calls) == model.n_layers


def test_exact_ordered_hook_names():
    model = make_model("vit", depth=1)
    assert model.hook_names() == [
        "hook_patch_embed",
        "hook_embed",
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_q",
        "blocks.0.attn.hook_k",
        "blocks.0.attn.hook_v",
        "blocks.0.attn.hook_attn_scores",
        "blocks.0.attn.hook_pattern",
        "blocks.0.attn.hook_z",
        "blocks.0.hook_attn_out",
        "blocks.0.hook_resid_mid",
        "blocks.0.mlp.hook_pre",
        "blocks.0.mlp.hook_post",
        "blocks.0.hook_mlp_out",
        "blocks.0.hook_resid_post",
        "hook_norm_final",
        "hook_selective_votes",
        "hook_pooled",
        "hook_logits",
    ]


@pytest.mark.parametrize("family", ["vit", "dinov2_reg", "clip"])
def test_shape_of_every_hook_kind(family):
    model = make_model(family)
    lay = model.layout
    t, d, h = lay.n_tokens, model.d_model, model.n_heads
    dh, dm = d // h, model.d_mlp
    shapes = model.hook_shapes(batch_size=3)
    expected = {
        "hook_embed": (3, t, d),
        "blocks.1.hook_resid_pre": (3, t, d),
        "blocks.1.attn.hook_q": (3, t, h, dh),
        "blocks.1.attn.hook_k": (3, t, h, dh),
        "blocks.1.attn.hook_v": (3, t, h, dh),
        "blocks.1.attn.hook_attn_scores": (3, h, t, t),
        "blocks.1.attn.hook_pattern": (3, h, t, t),
        "blocks.1.attn.hook_z": (3, t, h, dh),
        "blocks.1.hook_attn_out": (3, t, d),
        "blocks.1.hook_resid_mid": (3, t, d),
        "blocks.1.mlp.hook_pre": (3, t, dm),
        "blocks.1.mlp.hook_post": (3, t, dm),
        "blocks.1.hook_mlp_out": (3, t, d),
        "blocks.1.hook_resid_post": (3, t, d),
        "hook_norm_final": (3, t, d),
        "hook_pooled": (3, model.timm_model.head.in_features if hasattr(model.timm_model.head, "in_features") else d),
        "hook_logits": (3, model.timm_model.num_classes or d),
    }
    for name, shape in expected.items():
        assert shapes[name] == shape, name


def test_layout_read_from_model():
    reg = make_model("dinov2_reg").layout
    assert (reg.n_prefix, reg.n_registers, reg.cls_index, reg.grid) == (5, 4, 0, (16, 16))
    assert reg.patch_slice == slice(5, 261) and reg.register_slice == slice(1, 5)
    plain = make_model("vit").layout
    assert (plain.n_prefix, plain.n_registers, plain.cls_index, plain.grid) == (1, 0, 0, (14, 14))
    torch.manual_seed(0)
    no_cls = interp.load("vit_small_patch16_224", pretrained=False, depth=1, class_token=False, global_pool="avg")
    assert no_cls.layout.cls_index is None and no_cls.layout.n_prefix == 0


def test_dynamic_image_size_layout_follows_input():
    torch.manual_seed(0)
    model = interp.load("vit_small_patch14_dinov2", pretrained=False, depth=1, img_size=224, dynamic_img_size=True)
    x = images(1, size=280)
    out = model(x)
    assert model.layout.grid == (20, 20)
    ref = model.timm_model(x)
    assert (out - ref).abs().max() <= TOL


def test_state_dict_keys_unchanged_and_loadable_into_plain_timm():
    model = make_model("dinov2_reg")
    sd = model.state_dict()
    plain = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2, img_size=224)
    assert list(sd) == list(plain.state_dict())
    plain.load_state_dict(sd)
    plain.eval()
    x = images(1)
    assert (plain(x) - model(x)).abs().max() <= TOL


def test_hook_return_value_replaces_activation_and_hooks_are_removed():
    model = make_model("vit")
    x = images(2)
    base = model(x)

    def zero_resid(t, hook):
        return torch.zeros_like(t)

    edited = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_resid_post", zero_resid)])
    expected = model.timm_model.forward_head(model.timm_model.norm(torch.zeros(2, 197, model.d_model)))
    torch.testing.assert_close(edited, expected)
    torch.testing.assert_close(model(x), base)  # removed after the call
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())


def test_hooks_removed_after_exception():
    model = make_model("vit")

    def boom(t, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(images(1), fwd_hooks=[("blocks.0.hook_resid_pre", boom)])
    with pytest.raises(RuntimeError):
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", boom)]):
            model(images(1))
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())


def test_hooks_context_manager_and_glob_patterns():
    model = make_model("vit")
    seen = []
    with model.hooks(fwd_hooks=[("blocks.*.mlp.hook_post", lambda t, hook: seen.append(hook.name))]):
        model(images(1))
    assert seen == ["blocks.0.mlp.hook_post", "blocks.1.mlp.hook_post"]
    _, cache = model.run_with_cache(images(1), names_filter=["hook_embed", "blocks.1.hook_*_out"])
    assert sorted(cache) == ["blocks.1.hook_attn_out", "blocks.1.hook_mlp_out", "hook_embed"]
    _, cache = model.run_with_cache(images(1), names_filter=lambda n: n.endswith("hook_z"))
    assert sorted(cache) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]


def test_cache_components_add_up():
    model = make_model("deit3")
    _, cache = model.run_with_cache(images(1))
    for i in range(model.n_layers):
        c = lambda k: cache[f"blocks.{i}.{k}"]
        torch.testing.assert_close(c("hook_resid_mid"), c("hook_resid_pre") + c("hook_attn_out"))
        torch.testing.assert_close(c("hook_resid_post"), c("hook_resid_mid") + c("hook_mlp_out"))
        act = model.timm_model.blocks[i].mlp.act
        torch.testing.assert_close(c("mlp.hook_post"), act(c("mlp.hook_pre")))


def test_unknown_hook_name_lists_close_matches():
    model = make_model("vit")
    with pytest.raises(HookNameError, match="blocks.1.hook_resid_post"):
        model.run_with_cache(images(1), names_filter="blocks.1.hook_resid_pots")
    with pytest.raises(HookNameError, match="Close matches"):
        model.run_with_hooks(images(1), fwd_hooks=[("blocks.0.mlp.hook_psot", lambda t, hook: t)])
    with pytest.raises(HookNameError):
        model.run_with_cache(images(1), names_filter="blocks.*.hook_nothing")


def test_nnsight_edit_equals_hook_edit():
    from nnsight import NNsight

    model = make_model("vit")
    x = images(2)
    neuron = 7

    def zero_neuron(t, hook):
        t = t.clone()
        t[..., neuron] = 0
        return t

    expected = model.run_with_hooks(x, fwd_hooks=[("blocks.1.mlp.hook_post", zero_neuron)])
    nn_model = NNsight(model)
    with nn_model.trace(x):
        nn_model.blocks[1].mlp.hook_post.output[..., neuron] = 0
        out = nn_model.output.save()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)  # the same arithmetic, either way
    assert (out - model(x)).abs().max().item() > 1e-4  # the edit did something
    with nn_model.trace(x):
        resid = nn_model.blocks[0].hook_resid_post.output.save()
    _, cache = model.run_with_cache(x, names_filter="blocks.0.hook_resid_post")
    torch.testing.assert_close(resid, cache["blocks.0.hook_resid_post"])


def test_hooked_model_moves_with_to():
    model = make_model("vit")
    model.to(torch.float64)
    assert model.cls_token.dtype == torch.float64
    assert model.timm_model.cls_token is model.cls_token
    out = model(images(1).double())
    assert out.dtype == torch.float64


def test_blocks_needed_is_the_stop_layer_every_hook_fires_by():
    from interp.hooks.names import blocks_needed

    assert blocks_needed(["hook_embed"]) == 0
    assert blocks_needed(["hook_patch_embed"]) == 0
    assert blocks_needed(["blocks.3.hook_resid_post", "blocks.0.mlp.hook_post"]) == 4
    assert blocks_needed(["blocks.3.hook_resid_post", "hook_norm_final"]) is None  # needs the whole forward


@pytest.mark.parametrize("family", ["vit", "dinov2_reg", "clip"])
def test_patch_embed_hook_is_the_patch_embedding_before_position_embedding(family):
    """``hook_patch_embed`` [b, P, d]: timm's patch-embedding output (no prefix rows, no position embedding);
    an edit through it reaches the rest of the forward (here: zeroing it leaves prefix + position only)."""
    model = make_model(family)
    x = images(2)
    _, cache = model.run_with_cache(x, names_filter=["hook_patch_embed", "hook_embed"])
    lay = model.layout
    expected = model.timm_model.patch_embed(x)
    assert cache["hook_patch_embed"].shape == (2, lay.n_patches, model.d_model)
    torch.testing.assert_close(cache["hook_patch_embed"], expected)
    zeroed = model.run_with_hooks(x, fwd_hooks=[("hook_patch_embed", lambda t, hook: torch.zeros_like(t))],
                                  stop_at_layer=0)
    tm = model.timm_model
    torch.testing.assert_close(zeroed, tm.norm_pre(tm._pos_embed(torch.zeros_like(expected))))


def test_patch_embed_hook_with_dynamic_img_size():
    model = make_model("dinov2", dynamic_img_size=True)
    x = images(1, size=112)
    _, cache = model.run_with_cache(x, names_filter=["hook_patch_embed"])
    assert cache["hook_patch_embed"].shape == (1, 64, model.d_model)
    torch.testing.assert_close(cache["hook_patch_embed"], model.timm_model.patch_embed(x).flatten(1, 2))


def test_neuron_writes_include_layerscale_and_equal_what_the_block_adds():
    """A neuron's write direction is what the block adds to the residual per unit activation: gamma * fc2[:, n]
    on a LayerScale block (DINOv2), measured by running the MLP's tail on a one-hot activation."""
    model = interp.load("vit_small_patch14_dinov2", pretrained=False, depth=2, img_size=28)
    block = model.timm_model.blocks[1]
    with torch.no_grad():
        block.ls2.gamma.copy_(torch.logspace(-2, 0.5, block.ls2.gamma.numel()))  # a trained-like spread
    writes = model.neuron_writes(1)
    assert writes.shape == (model.d_model, model.d_mlp)
    for n in (0, 17, model.d_mlp - 1):
        h = torch.zeros(1, 1, model.d_mlp)
        h[..., n] = 1.0
        with torch.no_grad():
            measured = block.ls2(block.mlp.fc2(h) - block.mlp.fc2(torch.zeros_like(h)))[0, 0]
        assert torch.nn.functional.cosine_similarity(measured, writes[:, n], dim=0) > 1 - 1e-6
        assert torch.allclose(measured, writes[:, n], rtol=1e-5, atol=1e-7)
    plain = interp.load("vit_small_patch16_224", pretrained=False, depth=1, img_size=32)   # no LayerScale
    assert torch.equal(plain.neuron_writes(0), plain.timm_model.blocks[0].mlp.fc2.weight.detach().float())
