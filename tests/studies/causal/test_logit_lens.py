"""Logit lens and direct logit attribution: equal to TransformerLens's arithmetic (tests/reference/
tl_logit_attribution.py) on random ViT and Eva models, summing to the output, on every family; pyramids refused."""
from __future__ import annotations

import pytest
import torch

import interp
from conftest import images, make_model
from interp.errors import InterpError
from interp.hooks.load import load_skeleton
from interp.runtime.open import open_source
from interp.studies.causal.logit_lens import logit_lens_study
from reference.tl_logit_attribution import decompose_resid, ln_final_scale, logit_attrs, stack_head_results


def dinov3(**kw):
    torch.manual_seed(0)
    model = interp.load("vit_small_patch16_dinov3", pretrained=False, depth=2, img_size=64, **kw)
    with torch.no_grad():
        for block in model.timm_model.blocks:
            block.gamma_1.fill_(0.5), block.gamma_2.fill_(0.5)
        if isinstance(model.timm_model.head, torch.nn.Linear):  # timm scales a new head by 1e-3: logits ~1e-5
            model.timm_model.head.weight.normal_()
    return model


def oracle(model, x, cls: int):
    """TransformerLens's component attributions [2L + 1] and head attributions [L, h] (means over images)."""
    m = model.timm_model
    _, cache = model.run_with_cache(x)
    n = model.n_layers
    resid = cache[f"blocks.{n - 1}.hook_resid_post"]
    scale = ln_final_scale(resid, m.norm.eps)
    direction = m.norm.weight * m.head.weight[cls]
    pool, n_prefix = m.global_pool, m.num_prefix_tokens
    parts = logit_attrs(decompose_resid(cache, n), scale, direction, pool, n_prefix).mean(1)
    heads = []
    for layer, block in enumerate(m.blocks):
        gain = getattr(block.ls1, "gamma", 1.0) if hasattr(block, "ls1") else block.gamma_1
        d = block.attn.proj.weight.shape[0]
        W_O = block.attn.proj.weight.reshape(d, block.attn.num_heads, -1).permute(1, 2, 0) * gain
        stack = stack_head_results(cache[f"blocks.{layer}.attn.hook_z"], W_O)
        heads.append(logit_attrs(stack, scale, direction, pool, n_prefix).mean(1))
    block = m.blocks[-1]  # the last block's neurons: each one's write times its activation, a component of its own
    gain = getattr(block.ls2, "gamma", 1.0) if hasattr(block, "ls2") else block.gamma_2
    writes = block.mlp.fc2.weight.T * gain  # [n, d]
    post = cache[f"blocks.{n - 1}.mlp.hook_post"]
    neurons = lambda idx: logit_attrs(post[..., idx].permute(2, 0, 1)[..., None] * writes[idx][:, None, None],
                                      scale, direction, pool, n_prefix).mean(1).detach()
    return parts.detach(), torch.stack(heads).detach(), neurons


@pytest.mark.parametrize("kind", ["vit", "dinov3"])
def test_decomposition_equals_transformer_lens(kind):
    model = make_model("vit", img_size=64) if kind == "vit" else dinov3(num_classes=5)
    x = images(2, size=64)
    result = logit_lens_study(open_source(model=model, images=x), classes=(3,), progress=False)
    parts, heads, neurons = oracle(model, x, 3)
    assert torch.allclose(torch.tensor(result.dla["mean"]), parts, atol=1e-5, rtol=1e-4)
    assert torch.allclose(torch.tensor(result.dla["heads"]), heads, atol=1e-5, rtol=1e-4)
    listed = result.dla["neurons"]["1"]  # [[neuron, contribution], ...] by |contribution|
    assert torch.allclose(torch.tensor([v for _, v in listed]), neurons([i for i, _ in listed]), atol=1e-6)
    with torch.no_grad():
        logit = model(x)[:, 3].mean()
    assert abs(sum(result.dla["mean"]) + result.dla["bias"] - float(logit)) < 1e-5
    assert result.dla["max_sum_error"] < 1e-5


@pytest.mark.parametrize("kind", ["dinov2_reg", "clip", "dinov3"])
def test_every_family_reads_its_last_block_as_its_output(kind):
    model = dinov3() if kind == "dinov3" else make_model(kind, img_size=56 if kind == "dinov2_reg" else 64)
    x = images(2, size=56 if kind == "dinov2_reg" else 64)
    result = logit_lens_study(open_source(model=model, images=x), progress=False)
    assert result.rows == ["embed", "block 0", "block 1"] and result.grid == [4, 4]
    if kind == "clip":  # a projection head: each image's top coordinate, decomposed to the float error
        assert result.metric == "logit" and result.dla["max_sum_error"] < 1e-5
        assert len(result.dla["heads"]) == 2 and len(result.dla["neurons"]["1"]) == 5
        with torch.no_grad():
            assert abs(result.lens_pooled[-1] - float(model(x).max(-1).values.mean())) < 1e-5
    else:  # no head: the lens is the pooled vector's cosine to the final one, and says why
        assert result.metric == "cosine" and result.dla is None and "no head" in result.notes[0]
        assert abs(result.lens_pooled[-1] - 1.0) < 1e-5 and result.lens_pooled[0] < 0.99
    assert len(result.lens_prefix[0]) == (5 if kind != "clip" else 1)


@pytest.mark.parametrize("name", ["pvt_v2_b0", "swinv2_tiny_window8_256"])
def test_pyramids_are_refused_in_one_line(name):
    family = load_skeleton(name).family  # the study asks this before any forward
    with pytest.raises(InterpError, match="merge patches") as err:
        family.final_readout()
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_a_pooling_edit_is_refused_rather_than_misread():
    from interp.interventions import SelectiveCLS

    source = open_source(model=make_model("vit", img_size=64), images=images(2, size=64),
                         interventions=[SelectiveCLS(k=1)])
    with pytest.raises(InterpError, match="pooling edit"):
        logit_lens_study(source, progress=False)
