"""Interventions on HookedViT: each edit equals its definition computed by hand on the hook values,
batches equal single images, the composition order is the documented one, and state is always undone."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import images, make_model
from interp.errors import InterpError
from interp.hooks.edit_state import EditState
from interp.hooks.intervene import composition_order
from interp.interventions import (AttentionBias, NeuronAblation, Relocation, SelectiveCLS, TestTimeRegister,
                                  masks)

FAMILIES3 = ["vit", "dinov2_reg", "clip"]  # plain, trained registers (+LayerScale), CLIP (pre-norm)


def run_layer(model, x, interventions, layer):
    """(activation before any edit, activation after the edits) at ``blocks.{layer}.mlp.hook_post``."""
    names = [f"blocks.{layer}.mlp.hook_pre", f"blocks.{layer}.mlp.hook_post"]
    with model.intervene(*interventions):
        out, cache = model.run_with_cache(x, names_filter=names)
        n_prefix = model.layout.n_prefix
    before = model.timm_model.blocks[layer].mlp.act(cache[names[0]])
    return before, cache[names[1]], n_prefix, out


def signed_abs_max_by_hand(a):
    """a [t, k] -> the entry of largest |value| (python loop)."""
    best = a[0, 0]
    for v in a.reshape(-1):
        if v.abs() > best.abs():
            best = v
    return best


# ---------------------------------------------------------------------------------------------- NeuronAblation
@pytest.mark.parametrize("fam", FAMILIES3)
def test_zero_ablation_all_tokens_and_patches(fam):
    model, x = make_model(fam), images(2)
    idx = [3, 17, 200]
    before, after, n_prefix, _ = run_layer(model, x, [NeuronAblation({1: idx})], 1)
    assert torch.all(after[..., idx] == 0)
    others = [i for i in range(after.shape[-1]) if i not in idx]
    torch.testing.assert_close(after[..., others], before[..., others], rtol=0, atol=1e-6)

    before, after, n_prefix, _ = run_layer(model, x, [NeuronAblation({1: idx}, tokens="patches")], 1)
    assert n_prefix == model.layout.n_prefix
    assert torch.all(after[:, n_prefix:, idx] == 0)
    torch.testing.assert_close(after[:, :n_prefix, idx], before[:, :n_prefix, idx], rtol=0, atol=1e-6)


def test_mean_ablation_uses_calibrated_means():
    model, calib, x = make_model("dinov2_reg"), images(3, seed=5), images(2)
    neurons = {0: [5, 9], 1: [100]}
    ablation = NeuronAblation.calibrate_means(model, calib, neurons, tokens="patches", batch_size=2)
    _, cache = model.run_with_cache(calib, names_filter="blocks.*.mlp.hook_post")
    n_prefix = model.layout.n_prefix
    for layer, idx in neurons.items():
        by_hand = cache[f"blocks.{layer}.mlp.hook_post"][:, n_prefix:, idx].double().mean(dim=(0, 1)).float()
        torch.testing.assert_close(ablation.means[layer], by_hand, rtol=1e-5, atol=1e-6)
    before, after, n_prefix, _ = run_layer(model, x, [ablation], 0)
    assert torch.all(after[:, n_prefix:, [5, 9]] == ablation.means[0])
    torch.testing.assert_close(after[:, :n_prefix, [5, 9]], before[:, :n_prefix, [5, 9]], rtol=0, atol=1e-6)


class FakeCacheReader:
    """The reader protocol of interp.cache that NeuronAblation duck-types: ``reader[hook][i:j]`` (numpy),
    ``reader.batches(hook, batch_size)`` yielding (rows, array), ``meta["token_rows"]`` and ``layout``."""

    def __init__(self, arrays, token_rows, layout):
        self.arrays, self.meta, self.layout = arrays, {"token_rows": list(token_rows)}, layout

    def __getitem__(self, hook):
        return self.arrays[hook]

    def batches(self, hook, batch_size):
        data = self.arrays[hook]
        for i in range(0, len(data), batch_size):
            yield np.arange(i, min(i + batch_size, len(data))), data[i:i + batch_size]


def test_mean_ablation_from_activation_cache_equals_images():
    model, calib = make_model("dinov2_reg"), images(3, seed=5)
    lay, hook = model.layout, "blocks.1.mlp.hook_post"
    neurons = {1: [4, 8, 15]}
    _, cache = model.run_with_cache(calib, names_filter=hook)
    full = FakeCacheReader({hook: cache[hook].numpy()}, (0, lay.n_tokens), lay)
    patches_only = FakeCacheReader({hook: cache[hook][:, lay.patch_slice].numpy()},
                                   (lay.n_prefix, lay.n_tokens), lay)
    for tokens in ("all", "patches"):
        from_images = NeuronAblation.calibrate_means(model, calib, neurons, tokens=tokens, batch_size=2)
        readers = (full, patches_only) if tokens == "patches" else (full,)
        for reader in readers:
            from_cache = NeuronAblation.calibrate_means(model, reader, neurons, tokens=tokens, batch_size=2)
            torch.testing.assert_close(from_cache.means[1], from_images.means[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(InterpError, match="token rows"):
        NeuronAblation.calibrate_means(model, patches_only, neurons, tokens="all")


# ---------------------------------------------------------------------------------------------- Relocation
@pytest.mark.parametrize("fam,value", [("vit", "neuron_max"), ("dinov2_reg", "layer_max"), ("clip", "neuron_max")])
def test_relocation_writes_values_exactly_on_the_mask(fam, value):
    model, x = make_model(fam), images(2)
    mask = masks.smiley(model.layout.grid)
    idx = [7, 30, 31]
    before, after, n_prefix, _ = run_layer(model, x, [Relocation({0: idx}, target=mask, value=value)], 0)
    on, off = mask.reshape(-1), ~mask.reshape(-1)
    for b in range(x.shape[0]):
        for j, n in enumerate(idx):
            if value == "neuron_max":
                expected = before[b, :, n].max()
            else:
                expected = signed_abs_max_by_hand(before[b][:, idx])
            patches = after[b, n_prefix:, n]
            assert torch.all(patches[on] == expected)
            assert torch.all(patches[off] == 0)
    torch.testing.assert_close(after[:, :n_prefix, idx], before[:, :n_prefix, idx], rtol=0, atol=1e-6)


def test_relocation_mask_of_the_wrong_size_is_a_clear_error():
    model = make_model("vit")
    with pytest.raises(InterpError, match="patch grid"):
        model.run_with_interventions(images(1), [Relocation({0: [1]}, target=masks.box((10, 10), 0, 0, 2, 2))])


# ---------------------------------------------------------------------------------------------- TestTimeRegister
@pytest.mark.parametrize("fam", FAMILIES3)
def test_test_time_register_definition(fam):
    model, x = make_model(fam), images(3)
    base_layout = model.layout
    idx = [2, 11, 64]
    ttr = TestTimeRegister({0: idx, 1: [5]})
    names = ["blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post", "blocks.1.hook_resid_post", "hook_embed"]
    with model.intervene(ttr):
        assert model.layout.n_prefix == base_layout.n_prefix + 1 and model.layout.n_extra == 1
        out, cache = model.run_with_cache(x, names_filter=names)
    assert model.layout == base_layout  # undone
    reg = base_layout.n_prefix  # the added token sits right after the model's own prefix tokens
    n_prefix = reg + 1
    assert cache["blocks.1.hook_resid_post"].shape[1] == base_layout.n_tokens + 1
    assert torch.all(cache["hook_embed"][:, reg] == model.timm_model.norm_pre(torch.zeros(model.d_model)))
    assert out.shape == model(x).shape

    before = model.timm_model.blocks[0].mlp.act(cache["blocks.0.mlp.hook_pre"])
    after = cache["blocks.0.mlp.hook_post"]
    for b in range(x.shape[0]):
        v = signed_abs_max_by_hand(before[b][:, idx])  # over all tokens of image b, register row included
        assert torch.all(after[b, reg, idx] == v)
    assert torch.all(after[:, n_prefix:, idx] == 0)  # every patch of every image
    torch.testing.assert_close(after[:, :reg, idx], before[:, :reg, idx], rtol=0, atol=1e-6)  # CLS, registers
    others = [i for i in range(after.shape[-1]) if i not in idx]
    torch.testing.assert_close(after[..., others], before[..., others], rtol=0, atol=1e-6)


def test_test_time_register_fill_modes_and_neuron_max():
    model, x = make_model("vit"), images(2)
    idx = [1, 2, 3, 40]
    for fill in ("mean", "outliers"):
        ttr = TestTimeRegister({1: idx}, n_registers=2, value="neuron_max", patch_fill=fill)
        before, after, n_prefix, _ = run_layer(model, x, [ttr], 1)
        assert n_prefix == 3
        patches = before[:, n_prefix:, idx]
        mean = patches.mean(dim=1, keepdim=True)
        if fill == "mean":
            expected = mean.expand_as(patches)
        else:
            std = patches.std(dim=1, keepdim=True)
            expected = torch.where(patches > mean + std, mean, patches)
            assert (patches > mean + std).any()  # the test exercises the replacement
        torch.testing.assert_close(after[:, n_prefix:, idx], expected, rtol=0, atol=1e-6)
        for row in (1, 2):
            torch.testing.assert_close(after[:, row, idx], before[:, :, idx].amax(dim=1), rtol=0, atol=0)


def test_test_time_register_keeps_average_pooling_over_patches_only():
    model, x = make_model("vit", global_pool="avg", class_token=False, fc_norm=False), images(2)
    assert model.layout.n_prefix == 0
    with model.intervene(TestTimeRegister({0: [3]})):
        _, cache = model.run_with_cache(x, names_filter=["hook_norm_final", "hook_pooled"])
    patches = cache["hook_norm_final"][:, 1:]
    torch.testing.assert_close(cache["hook_pooled"], patches.mean(dim=1), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- AttentionBias
def test_attention_bias_records_register_key_value_and_applies_them():
    model, calib, x = make_model("dinov2_reg"), images(4, seed=2), images(2)
    neurons = {0: [10, 20]}
    bias = AttentionBias.calibrate(model, calib, neurons, batch_size=3)
    assert sorted(bias.keys) == [0, 1]
    assert bias.keys[0].shape == (model.n_heads, 1, model.d_model // model.n_heads)
    # By hand: the register row of hook_k / hook_v under the test-time register, averaged over images.
    with model.intervene(TestTimeRegister(neurons)):
        _, cache = model.run_with_cache(calib, names_filter=["blocks.1.attn.hook_k", "blocks.1.attn.hook_v"])
    reg = model.layout.n_prefix
    torch.testing.assert_close(bias.keys[1], cache["blocks.1.attn.hook_k"][:, reg].mean(0).unsqueeze(1),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bias.values[1], cache["blocks.1.attn.hook_v"][:, reg].mean(0).unsqueeze(1),
                               rtol=1e-5, atol=1e-5)
    # Applying: no extra token, neurons zero on patches, extra_kv set during and cleared after.
    with model.intervene(bias):
        assert sorted(model.edit_state.extra_kv) == [0, 1] and model.layout.n_extra == 0
        _, cache = model.run_with_cache(x, names_filter=["blocks.0.mlp.hook_post", "blocks.0.attn.hook_k"])
    assert model.edit_state.extra_kv == {}
    n_prefix = model.layout.n_prefix
    assert cache["blocks.0.attn.hook_k"].shape[1] == model.layout.n_tokens
    assert torch.all(cache["blocks.0.mlp.hook_post"][:, n_prefix:, [10, 20]] == 0)
    # The extra column changes attention like a key/value pair computed by hand (block 0 output).
    with model.intervene(AttentionBias(neurons, keys={0: bias.keys[0]}, values={0: bias.values[0]})):
        _, c = model.run_with_cache(x, names_filter=["blocks.0.attn.hook_q", "blocks.0.attn.hook_k",
                                                     "blocks.0.attn.hook_v", "blocks.0.attn.hook_z"])
    q, k, v = (c[f"blocks.0.attn.hook_{n}"].transpose(1, 2) for n in "qkv")  # [b, h, t, dh]
    k = torch.cat([k, bias.keys[0].unsqueeze(0).expand(2, -1, -1, -1)], dim=2)
    v = torch.cat([v, bias.values[0].unsqueeze(0).expand(2, -1, -1, -1)], dim=2)
    z = ((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5).softmax(-1) @ v
    torch.testing.assert_close(c["blocks.0.attn.hook_z"], z.transpose(1, 2), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------- SelectiveCLS (hooked)
@pytest.mark.parametrize("fam", ["vit", "dinov2_reg", "clip"])
def test_selective_cls_feeds_the_head_and_emits_votes(fam):
    from interp.interventions import selective_aggregate

    model, x = make_model(fam), images(2)
    with model.intervene(SelectiveCLS(k=1)):
        out, cache = model.run_with_cache(x, names_filter=["hook_norm_final", "hook_selective_votes", "hook_pooled"])
    assert model.edit_state.pool_override is None
    patches = cache["hook_norm_final"][:, model.layout.n_prefix:]
    g, votes = selective_aggregate(patches, k=1)
    m = model.timm_model
    torch.testing.assert_close(cache["hook_pooled"], m.fc_norm(g), rtol=0, atol=1e-6)
    torch.testing.assert_close(out, m.head(m.fc_norm(g)), rtol=0, atol=1e-6)
    assert cache["hook_selective_votes"].shape == (2, model.layout.n_patches)
    assert torch.all(cache["hook_selective_votes"].sum(-1) == model.d_model)
    torch.testing.assert_close(cache["hook_selective_votes"], votes)


def test_selective_cls_with_k_equal_n_is_average_pooling():
    model, x = make_model("vit"), images(2)
    n = model.layout.n_patches
    with model.intervene(SelectiveCLS(k=n)):
        _, cache = model.run_with_cache(x, names_filter=["hook_norm_final", "hook_pooled"])
    patches = cache["hook_norm_final"][:, model.layout.n_prefix:]
    torch.testing.assert_close(cache["hook_pooled"], model.timm_model.fc_norm(patches.mean(1)), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- batches
def test_batch_of_four_equals_four_batches_of_one():
    model, calib, x = make_model("dinov2_reg"), images(2, seed=7), images(4, seed=3)
    grid = model.layout.grid
    cases = [
        [NeuronAblation({0: [1, 2]}, tokens="patches")],
        [NeuronAblation.calibrate_means(model, calib, {1: [3, 4]})],
        [Relocation({0: [5, 6]}, target=masks.box(grid, 2, 2, 3, 4), value="layer_max")],
        [TestTimeRegister({0: [7, 8], 1: [9]}, patch_fill="outliers")],
        [AttentionBias.calibrate(model, calib, {0: [7, 8]})],
        [SelectiveCLS(k=2, score="contrib", fft="rfft")],
    ]
    for interventions in cases:
        batched = model.run_with_interventions(x, interventions)
        single = torch.cat([model.run_with_interventions(x[i:i + 1], interventions) for i in range(4)])
        torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-5, msg=lambda m: f"{interventions}: {m}")


# ---------------------------------------------------------------------------------------------- composition
def test_composition_order_is_stage_then_given_order():
    a, b = NeuronAblation({0: [1]}), Relocation({0: [1]}, target=torch.ones(2, 2, dtype=torch.bool))
    t1, t2, s = TestTimeRegister({0: [1]}), TestTimeRegister({1: [1]}), SelectiveCLS()
    bias = AttentionBias({0: [1]}, keys={0: torch.zeros(1, 1, 1)}, values={0: torch.zeros(1, 1, 1)})
    assert composition_order([s, a, t1, b, bias, t2]) == [t1, bias, t2, a, b, s]
    assert composition_order([b, a]) == [b, a]
    with pytest.raises(TypeError, match="not an intervention"):
        composition_order([a, "zero"])
    with pytest.raises(TypeError, match="twice"):
        composition_order([a, a])


def test_composed_edits_apply_in_the_documented_order():
    model, x = make_model("vit"), images(2)
    idx = [4, 9]
    ttr = TestTimeRegister({0: idx})
    mean = NeuronAblation({0: [4]}, mode="mean", means={0: torch.tensor([0.25])})
    reloc = Relocation({0: idx}, target=masks.box(model.layout.grid, 0, 0, 2, 2))
    # Stage rule: the test-time register (structural) edits first, whatever the list order; then the ablation.
    results = [run_layer(model, x, order, 0) for order in ([ttr, mean], [mean, ttr])]
    for before, after, n_prefix, _ in results:
        assert n_prefix == 2
        assert torch.all(after[..., 4] == 0.25)  # ablation last: every token, the register included
        assert torch.all(after[:, 2:, 9] == 0)
        for b in range(2):
            assert after[b, 1, 9] == signed_abs_max_by_hand(before[b][:, idx])  # v from pre-edit values
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)
    # Same stage: the order given. Relocation then mean-ablation vs the reverse differ, each as composed by hand.
    before, after_rm, n_prefix, _ = run_layer(model, x, [reloc, mean], 0)
    _, after_mr, _, _ = run_layer(model, x, [mean, reloc], 0)
    assert torch.all(after_rm[..., 4] == 0.25)
    on = reloc.target.reshape(-1)
    assert torch.all(after_mr[:, n_prefix:, 4][:, on] == 0.25) and torch.all(after_mr[:, n_prefix:, 4][:, ~on] == 0)
    # Two test-time registers: their tokens follow the prefix in composition order.
    t2 = TestTimeRegister({1: [3]})
    for layer, own_row, other_row, neurons in ((0, 2, 1, idx), (1, 1, 2, [3])):
        before, after, n_prefix, _ = run_layer(model, x, [t2, ttr], layer)  # t2's token is row 1, ttr's row 2
        assert n_prefix == 3
        assert torch.all(after[:, 3:, neurons] == 0)
        for b in range(2):
            assert torch.all(after[b, own_row, neurons] == signed_abs_max_by_hand(before[b][:, neurons]))
        torch.testing.assert_close(after[:, other_row], before[:, other_row], rtol=0, atol=1e-6)


def test_state_is_undone_after_exceptions_and_failed_setup():
    model, x = make_model("vit"), images(1)
    reference = model(x)
    bias = AttentionBias({0: [1]}, keys={1: torch.ones(6, 1, 64)}, values={1: torch.ones(6, 1, 64)})
    with pytest.raises(RuntimeError, match="boom"):
        with model.intervene(TestTimeRegister({0: [1]}), bias, SelectiveCLS(), NeuronAblation({1: [2]})):
            state = model.edit_state
            assert state.n_extra_tokens == 1 and state.extra_kv and state.pool_override is not None
            raise RuntimeError("boom")
    assert model.edit_state == EditState()  # the previous (empty) state object is back
    assert all(not hp._forward_hooks for hp in model.hook_dict.values())
    with pytest.raises(InterpError, match="one SelectiveCLS"):
        with model.intervene(TestTimeRegister({0: [1]}), SelectiveCLS(), SelectiveCLS(k=2)):
            pass
    assert model.edit_state == EditState()
    with pytest.raises(InterpError, match="does not exist"):
        model.run_with_interventions(x, [NeuronAblation({5: [1]})])
    with pytest.raises(InterpError, match="1536 neurons"):
        model.run_with_interventions(x, [TestTimeRegister({0: [1536]})])
    assert model.edit_state == EditState() and all(not hp._forward_hooks for hp in model.hook_dict.values())
    torch.testing.assert_close(model(x), reference, rtol=1e-6, atol=1e-6)


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="mode"):
        NeuronAblation({0: [1]}, mode="max")
    with pytest.raises(ValueError, match="calibrate_means"):
        NeuronAblation({0: [1]}, mode="mean")
    with pytest.raises(ValueError, match="twice"):
        TestTimeRegister({0: [1, 1]})
    with pytest.raises(ValueError, match="patch_fill"):
        TestTimeRegister({0: [1]}, patch_fill="median")
    with pytest.raises(ValueError, match="score"):
        SelectiveCLS(score="fast")
    with pytest.raises(ValueError, match="grid"):
        Relocation({0: [1]}, target=torch.ones(4, dtype=torch.bool))


def test_gradients_flow_through_edits():
    model, x = make_model("vit"), images(1)
    x.requires_grad_(True)
    out = model.run_with_interventions(x, [TestTimeRegister({0: [3]}), SelectiveCLS(k=2)])
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- masks
def test_masks():
    assert masks.box((14, 14), 2, 3, 4, 5).sum() == 20
    assert masks.box((14, 14), 2, 3, 4, 5)[2:6, 3:8].all()
    with pytest.raises(ValueError, match="does not fit"):
        masks.box((4, 4), 2, 2, 3, 1)
    m = masks.from_indices((3, 4), [0, 5, (2, 3)])
    assert m.reshape(-1).nonzero().reshape(-1).tolist() == [0, 5, 11]
    art = masks.from_string("""
        .#.
        #.#
    """)
    assert art.tolist() == [[False, True, False], [True, False, True]]
    assert torch.equal(masks.from_string(masks.to_string(art)), art)
    s = masks.smiley((14, 14))
    assert s.shape == (14, 14) and 8 <= int(s.sum()) < 40
    assert torch.equal(s, s.flip(1))  # left-right symmetric
    assert s[:7].sum() == 2  # two eyes in the upper half, the mouth below
