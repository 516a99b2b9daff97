"""Token replacement (zero, mean, noise, shuffle) at block outputs: each mode does what it says, Fix-Reg-Mean equals
Sun et al.'s reference, and the edit exported as a patch reproduces itself on a plain timm model."""
from __future__ import annotations

import copy

import pytest
import timm
import torch

import interp
from interp.errors import InterpError
from interp.interventions.token_replacement import TokenReplacement, calibrate, fix_reg_mean, token_rows
from reference.fix_reg_mean import apply_fix_reg_mean

REG = ("vit_small_patch14_reg4_dinov2", dict(depth=3, img_size=56, embed_dim=192, num_heads=3, init_values=0.5))


@pytest.fixture(scope="module")
def reg_model():
    torch.manual_seed(0)
    plain = timm.create_model(REG[0], pretrained=False, **REG[1]).eval()
    return plain, interp.HookedViT(copy.deepcopy(plain))


def pics(n, seed=0, size=56):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def outputs(model, x, edits, blocks):
    names = [model.block_names.resid_post(b) for b in blocks]
    with model.intervene(*edits):
        _, cache = model.run_with_cache(x, names_filter=lambda n: n in names)
    return [cache[n] for n in names]


def test_fix_reg_mean_equals_the_reference(reg_model):
    plain, model = reg_model
    calib, x = pics(6, seed=1), pics(3, seed=2)
    edit = fix_reg_mean(model, calib, batch_size=4)
    # the reference's per-layer means at each block's input: the register tokens themselves at block 0, then the
    # means this edit measured at the outputs of blocks 0..L-2
    first = (plain.reg_token[0]).detach()
    ref_model = copy.deepcopy(plain)
    apply_fix_reg_mean(ref_model, [first] + list(edit.means))
    with torch.no_grad():
        expected = ref_model.forward_features(x.clone())
        with model.intervene(edit):
            _, cache = model.run_with_cache(x, names_filter=lambda n: n == "hook_norm_final")
    torch.testing.assert_close(cache["hook_norm_final"], expected, rtol=1e-5, atol=1e-5)
    # and the edit changes the model (a test that could not fail would not test the reference)
    _, intact = model.run_with_cache(x, names_filter=lambda n: n == "hook_norm_final")
    assert (intact["hook_norm_final"] - expected).abs().max() > 1e-3


def test_each_mode_does_what_it_says(reg_model):
    _, model = reg_model
    rows = token_rows(model.layout, "registers")
    stats = calibrate(model, pics(8, seed=3), rows, blocks=[1], batch_size=3)
    x = pics(4, seed=4)
    (intact,) = outputs(model, x, [], [1])
    zero, = outputs(model, x, [TokenReplacement(rows, "zero", blocks=[1])], [1])
    assert zero[:, rows].abs().max() == 0 and torch.equal(zero[:, 6:], intact[:, 6:])
    mean, = outputs(model, x, [TokenReplacement(rows, "mean", blocks=[1], means=stats.means)], [1])
    torch.testing.assert_close(mean[:, rows], stats.means[0].expand(4, -1, -1))
    noise_a, = outputs(model, x, [TokenReplacement(rows, "noise", blocks=[1], means=stats.means, stds=stats.stds,
                                                   seed=7)], [1])
    noise_b, = outputs(model, x, [TokenReplacement(rows, "noise", blocks=[1], means=stats.means, stds=stats.stds,
                                                   seed=7)], [1])
    assert torch.equal(noise_a, noise_b) and not torch.allclose(noise_a[:, rows], mean[:, rows])
    shuffled, = outputs(model, x, [TokenReplacement(rows, "shuffle", blocks=[1], bank=stats.bank, seed=1)], [1])
    for i in range(4):  # every image carries another image's registers, never its own
        match = [j for j in range(4) if torch.equal(shuffled[i, rows], intact[j, rows])]
        assert match and match[0] != i
    one, = outputs(model, x[:1], [TokenReplacement(rows, "shuffle", blocks=[1], bank=stats.bank)], [1])
    assert any(torch.allclose(one[0, rows], b) for b in stats.bank[0])  # a batch of one draws from the bank


def test_exported_patch_reproduces_the_edit_on_plain_timm(reg_model, tmp_path):
    plain, model = reg_model
    rows = token_rows(model.layout, "cls")
    stats = calibrate(model, pics(4, seed=5), rows)
    edit = TokenReplacement(rows, "mean", means=stats.means)
    x = pics(2, seed=6)
    with torch.no_grad():
        expected = model.run_with_interventions(x, [edit])
        path = interp.patch.save([edit], tmp_path / "cls_mean.safetensors", model)
        patched = interp.patch.apply(copy.deepcopy(plain), path)
        torch.testing.assert_close(patched(x), expected, rtol=1e-5, atol=1e-5)
        assert (plain(x) - expected).abs().max() > 1e-4


def test_targets_and_refusals():
    layout = interp.load("planted_vit").layout
    assert token_rows(layout, "cls") == [0] and token_rows(layout, "patches:0,5") == [1, 6]
    drawn = token_rows(layout, "random:4", seed=3)
    assert len(drawn) == 4 and min(drawn) >= 1 and drawn == token_rows(layout, "random:4", seed=3)
    with pytest.raises(InterpError, match="no register tokens"):
        token_rows(layout, "registers")
    with pytest.raises(InterpError, match="unknown target"):
        token_rows(layout, "tokens")
    with pytest.raises(ValueError, match="needs means"):
        TokenReplacement([0], "mean")
