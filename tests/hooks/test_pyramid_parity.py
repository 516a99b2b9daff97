"""Pyramid families (PVTv2) against timm's own forward: every block's output and the logits within 1e-5
(float32), with the fused kernel and with pattern hooks; hook names, shapes and the per-stage layout."""
from __future__ import annotations

import copy
import re

import pytest
import torch

import interp
from interp.errors import ImageError, InterpError, UnsupportedModelError
from interp.models.families import family_of

TOL = 1e-5
SIZE = 64  # PVTv2-b0 grids 16, 8, 4, 2 (keys 2x2 in every stage)

_BUILT = {}


def pvt(**kwargs):
    """A random-init pvt_v2_b0 (seed 0), a fresh copy per test."""
    key = repr(sorted(kwargs.items()))
    if key not in _BUILT:
        _BUILT[key] = interp.load("pvt_v2_b0", pretrained=False, **kwargs)
    return copy.deepcopy(_BUILT[key])


def x_images(n=2, size=SIZE):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def timm_block_outputs(model, x):
    """timm's logits and every block's output [b, t, d] from its own forward (forward hooks on the blocks)."""
    outs = []
    handles = [block.register_forward_hook(lambda m, i, o: outs.append(o.reshape(o.shape[0], -1, o.shape[-1])))
               for _, block in model.family.blocks()]  # Swin's blocks give [b, h, w, d] maps
    try:
        with torch.no_grad():
            logits = model.timm_model(x)
    finally:
        for h in handles:
            h.remove()
    return logits, outs


def max_diffs(model, x, names_filter):
    """{block hook prefix or 'logits': max |hooked - timm|}, and the cache."""
    logits_ref, ref = timm_block_outputs(model, x)
    with torch.no_grad():
        logits, cache = model.run_with_cache(x, names_filter=names_filter)
    diffs = {"logits": (logits - logits_ref).abs().max().item()}
    for i, r in enumerate(ref):
        got = cache[model.block_names.resid_post(i)]
        assert got.shape == r.shape
        diffs[model.block_names.prefixes[i]] = (got - r).abs().max().item()
    return diffs, cache


def set_fused(model, fused):
    for _, block in model.family.blocks():
        block.attn.fused_attn = fused


def test_pvt_parity_fused_every_block_and_logits():
    model = pvt()
    diffs, _ = max_diffs(model, x_images(), "*.hook_resid_post")
    assert len(diffs) == 9 and max(diffs.values()) <= TOL, diffs


def test_pvt_parity_unfused_with_pattern_hooks():
    model = pvt()
    set_fused(model, False)
    diffs, cache = max_diffs(model, x_images(), lambda n: n.endswith(("hook_resid_post", "hook_pattern")))
    assert max(diffs.values()) <= TOL, diffs
    # patterns over the reduced keys: stage 0's 16x16 queries read a 2x2 key grid (sr 8)
    pattern = cache["stages.0.blocks.0.attn.hook_pattern"]
    assert pattern.shape == (2, 1, 256, 4) and model.family.key_grid(0, (SIZE, SIZE)) == (2, 2)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 1, 256), atol=1e-5, rtol=0)
    assert cache["stages.3.blocks.1.attn.hook_pattern"].shape == (2, 8, 4, 4)  # sr 1: keys are the tokens


def test_pvt_pattern_is_the_softmax_of_q_and_reduced_k():
    model = pvt()
    names = [f"stages.1.blocks.0.attn.{h}" for h in ("hook_q", "hook_k", "hook_attn_scores", "hook_pattern")]
    _, cache = model.run_with_cache(x_images(1), names_filter=names)
    q, k = (cache[n].transpose(1, 2) for n in names[:2])  # [b, h, t, dh], [b, h, t_k, dh]
    scores = (q * model.family.block(2).attn.scale) @ k.transpose(-2, -1)
    torch.testing.assert_close(cache[names[2]], scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache[names[3]], scores.softmax(-1), atol=1e-6, rtol=1e-5)


def test_pvt_neurons_are_what_fc2_reads():
    """mlp.hook_post (GELU after the depthwise conv) times fc2 is the block's MLP output."""
    model = pvt()
    p = model.block_names
    _, cache = model.run_with_cache(x_images(1), names_filter=[p.mlp_post(4), p.mlp_out(4), p.mlp_pre(4)])
    fc2 = model.family.mlp(4).fc2
    torch.testing.assert_close(fc2(cache[p.mlp_post(4)]), cache[p.mlp_out(4)], atol=1e-6, rtol=1e-5)
    assert cache[p.mlp_pre(4)].shape == (1, 16, model.family.d_mlp(4))
    writes = model.neuron_writes(4)
    assert writes.shape == (160, 640) and torch.equal(writes, fc2.weight.detach())


def test_pvt_layout_names_and_stop_at_layer():
    model = pvt()
    lay = model.layout_for((SIZE, SIZE))
    assert lay.cls_index is None and lay.n_prefix == 0 and lay.kind_slices()["cls"] == slice(0, 0)
    assert lay.stage_grids == ((16, 16), (8, 8), (4, 4), (2, 2)) and lay.block_stages == (0, 0, 1, 1, 2, 2, 3, 3)
    assert model.block_names.prefixes[2] == "stages.1.blocks.0" and model.block_names.label(2) == "stage 1 block 0"
    assert model.patch_size == (4, 4) and model.d_model == 256
    x = x_images(1)
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names_filter=["stages.1.blocks.0.hook_resid_post", "hook_norm_final",
                                                         "hook_pooled"])
        stopped = model(x, stop_at_layer=3)
        feats = model.timm_model.forward_features(x)  # [b, d, h, w], normed
    torch.testing.assert_close(stopped, cache["stages.1.blocks.0.hook_resid_post"], atol=1e-6, rtol=1e-6)
    assert stopped.shape == (1, 64, 64)
    torch.testing.assert_close(cache["hook_norm_final"], feats.flatten(2).transpose(1, 2), atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["hook_pooled"], feats.mean((-1, -2)), atol=1e-5, rtol=0)


def test_pvt_edit_on_a_hook_changes_the_output():
    model = pvt()
    x = x_images(1)
    with torch.no_grad():
        clean = model(x)
        zeroed = model.run_with_hooks(x, fwd_hooks=[("stages.2.blocks.*.mlp.hook_post", lambda t, hook: t * 0)])
    assert (clean - zeroed).abs().max() > 1e-4


def test_pvt_plain_model_takes_the_same_edits():
    """Patch-file stand-ins: an MLP edit after the activation and extra key/value columns equal the hooked edits."""
    from interp.models.families.pvt import PvtV2Family

    model = pvt()
    x = x_images(1)
    scale = torch.nn.Identity()
    kv = (torch.randn(5, 3, 32, generator=torch.Generator().manual_seed(1)),
          torch.randn(5, 3, 32, generator=torch.Generator().manual_seed(2)))

    class Double(torch.nn.Module):
        def forward(self, h):
            return 2 * h

    with torch.no_grad():
        hooked = model.run_with_hooks(x, fwd_hooks=[("stages.2.blocks.1.mlp.hook_post", lambda t, hook: 2 * t)])
        plain = copy.deepcopy(model.timm_model)
        family = PvtV2Family(plain)
        family.plain_mlp_edits(5, [Double(), scale])
        keys = set(plain.state_dict())
        assert keys == set(model.timm_model.state_dict())
        torch.testing.assert_close(plain(x), hooked, atol=1e-5, rtol=0)

        from interp.hooks.edit_state import EditState
        model.edit_state = EditState().add_kv({4: kv}, torch.device("cpu"))
        hooked_kv = model(x)
        model.edit_state = EditState()
        plain = copy.deepcopy(model.timm_model)
        PvtV2Family(plain).plain_extra_kv(4, kv)
        torch.testing.assert_close(plain(x), hooked_kv, atol=1e-5, rtol=0)
        assert (hooked_kv - model(x)).abs().max() > 1e-5


def test_pvt_refusals_in_one_line():
    model = pvt()
    with pytest.raises(ImageError, match="at least 29x29"):
        model(torch.zeros(1, 3, 24, 24))
    from interp.hooks.edit_state import EditState
    model.edit_state = EditState().add_tokens(1)
    with pytest.raises(InterpError, match="test-time registers are not defined for .*PyramidVisionTransformerV2"):
        model(x_images(1))
    import timm
    linear = timm.create_model("pvt_v2_b2_li", pretrained=False, depths=(1, 1, 1, 1))
    with pytest.raises(UnsupportedModelError, match="linear spatial-reduction") as refused:
        family_of(linear)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 200  # not every family's title (issue 52)


def test_interp_hooks_lists_the_stage_qualified_names(capsys):
    from interp.cli import main

    assert main(["hooks", "pvt_v2_b0", "--no-pretrained", "--img-size", str(SIZE), "--pattern", "stages.0.*"]) == 0
    out = capsys.readouterr().out
    assert "stage_grids': [[16, 16], [8, 8], [4, 4], [2, 2]]" in out and "'cls_index': None" in out
    assert re.search(r"stages\.0\.blocks\.1\.attn\.hook_pattern +\[1, 1, 256, 4\]", out)
    assert "stages.0.blocks.0.mlp.hook_post" in out and "stages.1." not in out


# ---------------------------------------------------------------------------------------------- Swin-v2
SWIN_KW = dict(embed_dim=24, depths=(2, 2, 2, 2), num_heads=(1, 2, 3, 4), window_size=4)


def swin(img_size=64, **kwargs):
    """A tiny random swinv2 (window 4; 64 px: grids 16, 8, 4, 2) whose residual post-norms, q/v biases and logit
    scales are drawn at random (timm starts the post-norms at zero, which would make every block a no-op)."""
    key = ("swin", img_size, repr(sorted(kwargs.items())))
    if key not in _BUILT:
        model = interp.load("swinv2_tiny_window8_256", pretrained=False, img_size=img_size, **SWIN_KW, **kwargs)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for _, block in model.family.blocks():
                for norm in (block.norm1, block.norm2):
                    norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=g))
                    norm.bias.copy_(0.1 * torch.randn(norm.bias.shape, generator=g))
                attn = block.attn
                for p in (attn.q_bias, attn.v_bias):
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
                attn.logit_scale.copy_(2 + 0.5 * torch.randn(attn.logit_scale.shape, generator=g))
        _BUILT[key] = model
    return copy.deepcopy(_BUILT[key])


@pytest.mark.parametrize("size", [64, 72])  # 72: grids 18, 9, 5, 3, padded to whole windows
def test_swin_parity_every_block_and_logits(size):
    model = swin(size)
    diffs, cache = max_diffs(model, x_images(2, size), lambda n: n.endswith(("hook_resid_post", "hook_pattern")))
    assert len(diffs) == 9 and max(diffs.values()) <= TOL, diffs
    assert [b.shift_size for _, b in model.family.blocks()][:4] == [(0, 0), (2, 2), (0, 0), (2, 2)]
    pattern = cache["layers.0.blocks.1.attn.hook_pattern"]  # [b, n_w, h, N, N]
    n_w = model.family.window_tokens(1, (size, size)).shape[0]
    assert pattern.shape == (2, n_w, 1, 16, 16)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, n_w, 1, 16), atol=1e-5, rtol=0)


def test_swin_parity_with_a_dynamic_size():
    model = swin(64, dynamic_img_size=True)
    diffs, _ = max_diffs(model, x_images(1, 96), "*.hook_resid_post")
    assert max(diffs.values()) <= TOL, diffs
    assert model.layout.stage_grids == ((24, 24), (12, 12), (6, 6), (3, 3))


def test_swin_window_tokens_map_window_slots_back_to_the_grid():
    """Window w's slot n holds token window_tokens[w, n]: its query is the projection of that token's residual."""
    import torch.nn.functional as F

    model = swin(72)
    layer = 3  # layers.1.blocks.1: shifted windows over a 9x9 grid padded to 12x12
    p = model.block_names
    _, cache = model.run_with_cache(x_images(1, 72), names_filter=[p.resid_pre(layer), p.attn_q(layer),
                                                                    p.attn_pattern(layer)])
    attn = model.family.block(layer).attn
    q_tokens = F.linear(cache[p.resid_pre(layer)], attn.qkv.weight[:attn.dim], attn.q_bias)  # [1, t, d]
    slots = model.family.window_tokens(layer, (72, 72))  # [n_w, N]
    q = cache[p.attn_q(layer)][0].flatten(-2)  # [n_w, N, d]
    real = slots >= 0
    assert slots.shape == (9, 16) and int(real.sum()) == 81 and sorted(slots[real].tolist()) == list(range(81))
    torch.testing.assert_close(q[real], q_tokens[0, slots[real]], atol=1e-5, rtol=0)
    # the shift mask: a query attends (almost) nothing in the windows' parts the roll brought from elsewhere
    pattern = cache[p.attn_pattern(layer)][0]  # [n_w, h, N, N]
    assert pattern[-1, :, 0, -1].max() < 1e-20  # last window: slot 0 and slot N-1 come from different regions


def test_swin_edits_and_refusals():
    model = swin()
    x = x_images(1)
    with torch.no_grad():
        clean = model(x)
        zeroed = model.run_with_hooks(x, fwd_hooks=[("layers.2.blocks.*.mlp.hook_post", lambda t, hook: t * 0)])
        assert (clean - zeroed).abs().max() > 1e-4
        assert model.layout.cls_index is None and model.block_names.label(7) == "stage 3 block 1"
        stopped = model(x, stop_at_layer=2)
    assert stopped.shape == (1, 256, 24)
    with pytest.raises(ImageError, match="takes 64x64 images"):
        model(x_images(1, 96))
    from interp.hooks.edit_state import EditState
    for state, what in ((EditState().add_tokens(1), "test-time registers"),
                        (EditState().add_kv({0: (torch.zeros(1, 1, 24), torch.zeros(1, 1, 24))}, torch.device("cpu")),
                         "an attention bias")):
        model.edit_state = state
        with pytest.raises(InterpError, match=f"{what} (is|are) not defined for timm SwinTransformerV2"):
            model(x)


def test_pyramid_weight_files_load_without_a_position_table(tmp_path):
    """A local weight file of a model without a position table (no grid to fit or resample) loads as is."""
    import timm

    for name, kwargs in (("pvt_v2_b0", {}), ("swinv2_tiny_window8_256", dict(img_size=64, **SWIN_KW))):
        plain = timm.create_model(name, pretrained=False, **kwargs).eval()
        torch.save(plain.state_dict(), tmp_path / f"{name}.pth")
        model = interp.load(name, weights=tmp_path / f"{name}.pth", **kwargs)
        x = x_images(1, 64)
        with torch.no_grad():
            torch.testing.assert_close(model(x), plain(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("which", ["pvt", "swin"])
def test_pyramid_attention_hooks_cache_in_their_own_coordinates(which, tmp_path):
    """PVTv2's reduced keys and Swin's windows are stored whole and read back as run_with_cache gives them."""
    import interp.cache

    model = pvt() if which == "pvt" else swin()
    hooks = (["stages.0.blocks.0.attn.hook_k", "stages.1.blocks.1.attn.hook_pattern", "stages.2.blocks.0.hook_resid_post"]
             if which == "pvt" else
             ["layers.0.blocks.1.attn.hook_q", "layers.1.blocks.1.attn.hook_pattern", "layers.2.blocks.0.hook_resid_post"])
    x = x_images(2)
    summary = interp.cache.write(model, x, hooks=hooks, path=tmp_path / "acts.h5", dtype="float32", progress=False)
    assert summary.complete
    with torch.no_grad():
        _, ref = model.run_with_cache(x, names_filter=hooks)
    with interp.cache.open(tmp_path / "acts.h5", model=model) as cache:
        for hook in hooks:
            torch.testing.assert_close(torch.as_tensor(cache[hook][:]), ref[hook], atol=1e-6, rtol=0)


# family x hook: each hook point against the timm submodule output it stands for (forward hooks on timm's modules)
def _pvt_points(b):
    def k_or_v(which):
        return lambda o: o.reshape(b, o.shape[1], 2, -1)[:, :, which]  # kv output [b, t_k, 2d] -> [b, t_k, d]
    return {"mlp.hook_pre": ("mlp.fc1", None), "mlp.hook_post": ("mlp.act", None),
            "hook_attn_out": ("attn", None), "hook_mlp_out": ("mlp", None),
            "attn.hook_q": ("attn.q", None), "attn.hook_k": ("attn.kv", k_or_v(0)),
            "attn.hook_v": ("attn.kv", k_or_v(1))}


def _swin_points(b):
    flat = lambda o: o.reshape(b, -1, o.shape[-1])  # noqa: E731  [b, h, w, d] -> [b, t, d]
    windows = lambda o: o.reshape(b, -1, *o.shape[1:])  # noqa: E731  [b * n_w, h, N, N] -> [b, n_w, h, N, N]
    return {"mlp.hook_pre": ("mlp.fc1", None), "mlp.hook_post": ("mlp.act", None),
            "hook_attn_out": ("norm1", flat), "hook_mlp_out": ("norm2", None),
            "attn.hook_pattern": ("attn.softmax", windows)}


@pytest.mark.parametrize("which", ["pvt", "swin"])
def test_every_hook_point_equals_the_timm_module_output_it_stands_for(which):
    """The parity table's rows: per family and hook, max |hook - timm module output| over every block <= 1e-5."""
    model = pvt() if which == "pvt" else swin(72)
    size = SIZE if which == "pvt" else 72
    x = x_images(2, size)
    points = (_pvt_points if which == "pvt" else _swin_points)(2)
    timm_out, handles = {}, []
    for i, (_, block) in enumerate(model.family.blocks()):
        for leaf, (path, _) in points.items():
            module = block.get_submodule(path)
            handles.append(module.register_forward_hook(
                lambda m, inp, out, key=(i, leaf): timm_out.setdefault(key, out)))
    try:
        with torch.no_grad():
            model.timm_model(x)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names_filter=lambda n: any(n.endswith(leaf) for leaf in points))
    worst = {}
    for (i, leaf), out in timm_out.items():
        transform = points[leaf][1]
        ref = transform(out) if transform else out
        got = cache[model.block_names.hook(i, leaf)]
        if leaf.startswith("attn.hook_") and got.ndim == 4 and ref.ndim == 3:  # [b, t, h, dh] vs [b, t, d]
            got = got.flatten(2)
        assert got.shape == ref.shape, (leaf, got.shape, ref.shape)
        worst[leaf] = max(worst.get(leaf, 0.0), (got - ref).abs().max().item())
    assert set(worst) == set(points) and max(worst.values()) <= TOL, worst
