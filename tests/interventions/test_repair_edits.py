"""The two repairs new to the repairs study match their definitions: ``HighNormReplacement`` (high-norm patch rows
become their image's mean normal patch at the listed blocks' outputs) and ``RegCache`` (the outlier tokens' mean
key and value, appended from a middle block on)."""
from __future__ import annotations

import pytest
import torch

import interp
from interp.interventions import HighNormReplacement, RegCache
from interp.interventions.high_norm_replacement import MeanFill
from interp.interventions.spec import interventions_from_spec


def test_mean_fill_on_a_tiny_case():
    x = torch.tensor([[[9.0, 9.0], [1.0, 0.0], [5.0, 0.0], [3.0, 0.0], [0.0, 1.0]]])  # prefix row, then 4 patches
    out = MeanFill(n_prefix=1, threshold=4.0)(x)
    normal_mean = torch.tensor([(1 + 3 + 0) / 3, 1 / 3])
    assert torch.equal(out[0, 0], x[0, 0]) and torch.allclose(out[0, 2], normal_mean)  # prefix kept, outlier filled
    assert torch.equal(out[0, [1, 3, 4]], x[0, [1, 3, 4]])
    hot = torch.full((1, 3, 2), 10.0)  # every patch above: nothing to take a mean of, left as it is
    assert torch.equal(MeanFill(0, 4.0)(hot), hot)
    with pytest.raises(ValueError, match="finite and positive"):
        HighNormReplacement({2: float("inf")})


@pytest.fixture(scope="module")
def small():
    model = interp.load("planted_vit", img_size=64)
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 0.01  # flat: all artifacts?
    images[:, :, :32] = torch.randn(2, 3, 32, 64, generator=torch.Generator().manual_seed(1))  # top half textured
    return model, images


def test_high_norm_replacement_in_the_model(small):
    model, images = small
    hook = model.block_names.resid_post(2)
    _, before = model.run_with_cache(images, names_filter=hook)
    patches = before[hook][:, model.layout.patch_slice]
    norms = patches.norm(dim=-1)
    thr = float(norms.median())
    edit = HighNormReplacement({2: thr})
    with model.intervene(edit):
        _, after = model.run_with_cache(images, names_filter=hook)
    edited = after[hook][:, model.layout.patch_slice]
    hot = norms > thr
    assert hot.any() and (~hot).any()
    assert torch.equal(edited[~hot], patches[~hot])
    for i in range(len(images)):
        assert torch.allclose(edited[i][hot[i]], patches[i][~hot[i]].mean(0).expand(int(hot[i].sum()), -1), atol=1e-5)
    again = interventions_from_spec([edit.to_spec()])[0]
    assert again.thresholds == edit.thresholds


def test_regcache_is_the_outliers_mean_key_value_from_its_block_on(small):
    model, images = small
    names = model.block_names
    _, cache = model.run_with_cache(images, names_filter=lambda n: n.endswith(("hook_k", "hook_v", "resid_post")))
    patches = model.layout.patch_slice
    outliers = cache[names.resid_post(2)][:, patches].norm(dim=-1) > cache[names.resid_post(2)][:, patches].norm(
        dim=-1).median()
    rc = RegCache.calibrate(model, images, outliers, start=3, batch_size=1)
    assert sorted(rc.keys) == [3, 4, 5] and rc.keys[3].shape == (model.n_heads, 1, model.d_model // model.n_heads)
    for block in (3, 5):
        k = cache[names.attn_k(block)][:, patches][outliers].mean(0)  # [h, dh]
        v = cache[names.attn_v(block)][:, patches][outliers].mean(0)
        assert torch.allclose(rc.keys[block][:, 0], k, atol=1e-5) and torch.allclose(rc.values[block][:, 0], v,
                                                                                     atol=1e-5)
    with model.intervene(rc):  # the prefix enters at block 3: blocks before it are untouched, block 3 is not
        _, edited = model.run_with_cache(images, names_filter=lambda n: n.endswith("resid_post"))
        logits = model(images)
    assert torch.equal(edited[names.resid_post(2)], cache[names.resid_post(2)])
    assert not torch.allclose(edited[names.resid_post(3)], cache[names.resid_post(3)])
    assert logits.shape == (2, 10)  # nothing of the prefix reaches the output's shape
    again = interventions_from_spec([rc.to_spec()])[0]
    assert torch.equal(again.keys[4], rc.keys[4])
    with pytest.raises(interp.InterpError, match="middle block"):
        RegCache.calibrate(model, images, outliers, start=0)
