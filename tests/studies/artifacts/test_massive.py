"""The massive-activation study: Sun et al.'s profile equals their reference arithmetic on random-init models of
the papers' families, finds the planted activation where it forms (and not before), and says when there is none."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import timm
import torch

import interp
from interp.studies import open_source
from interp.studies.artifacts.massive import massive_study
from reference import massive_activations as ref


@pytest.mark.parametrize("name,kwargs", [
    ("vit_small_patch16_224", dict(depth=3, img_size=64, embed_dim=192, num_heads=3)),
    ("vit_small_patch14_reg4_dinov2", dict(depth=3, img_size=56, embed_dim=192, num_heads=3)),
    ("vit_small_patch16_dinov3", dict(depth=3, img_size=64, embed_dim=192, num_heads=3)),
])
def test_profile_equals_the_reference(name, kwargs):
    torch.manual_seed(0)
    plain = timm.create_model(name, pretrained=False, **kwargs).eval()
    x = torch.randn(5, 3, kwargs["img_size"], kwargs["img_size"], generator=torch.Generator().manual_seed(1))
    expected = ref.layer_stats(plain, plain.blocks, x)  # [4, L]
    model = interp.HookedViT(copy.deepcopy(plain))
    result = massive_study(open_source(model=model, images=x, batch_size=2), progress=False)
    ours = np.vstack([np.asarray(result.top), np.asarray(result.median)[None]])
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    assert result.massive_blocks == []  # a random model has none, and says so with its largest ratio
    assert result.message.startswith("no massive activations") and "x the median at block" in result.message
    if name.endswith("dinov3") or "reg4" in name:
        assert result.attention is not None and result.attention["massive"][0] is None


def test_planted_activation_found_where_it_forms(tmp_path):
    """planted_vit's register neurons write channel 9 of a few patches at block 2 (about 2,000x the median); the
    value of 100 its embedding carries from the input on (channel 10) is large but not massive by the criterion."""
    model = interp.load("planted_vit")
    x = interp.load_images(interp.models.inputs.samples.SAMPLES_DIR, model)
    result = massive_study(open_source(model=model, images=x), progress=False)
    assert result.massive_blocks[0] == 2 and result.ratio[1] < 1000 <= result.ratio[2]
    assert result.channels[2][0]["channel"] == 9 and result.tokens[2]["patches"] == len(x)
    # the carrying tokens are attention sinks in the next block: they receive higher logits than the rest
    assert result.attention["massive"][3] > result.attention["others"][3] + 1
    assert result.final_norm["ratio"] < result.ratio[-1]  # the final norm rescales each token
    assert "from block 2 on" in result.message and "channel 9" in result.message


def test_pyramid_profile_without_attention_logits():
    model = interp.load("pvt_v2_b0", pretrained=False, img_size=64, seed=0)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    result = massive_study(open_source(model=model, images=x), progress=False)
    assert len(result.top[0]) == model.n_layers and result.attention is None
    assert "pyramid" in result.attention_note
