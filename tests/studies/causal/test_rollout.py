"""Attention rollout and relevance equal Chefer's code (tests/reference/chefer_rollout.py) on a random ViT; they
run on DINOv2-reg, DINOv3 (RoPE) and a CLIP tower; pyramids and CLS-less models are refused in one line."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import interp
from conftest import images, make_model
from interp.hooks.load import load_skeleton
from interp.runtime.open import open_source
from interp.studies.causal.rollout import refusal, rollout_study
from reference.chefer_rollout import generate_relevance, generate_rollout


def test_rollout_and_relevance_equal_chefers_code():
    model = make_model("vit", img_size=64)
    x = images(2, size=64)
    result = rollout_study(open_source(model=model, images=x), classes=(3,), progress=False)
    kept = {}

    def keep(tensor, hook):
        tensor.retain_grad()
        kept[hook.name] = tensor

    out = model.run_with_hooks(x.requires_grad_(True), fwd_hooks=[(lambda n: n.endswith("hook_pattern"), keep)])
    out[:, 3].sum().backward()
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(2)]
    patterns, grads = [kept[n].detach() for n in names], [kept[n].grad for n in names]
    assert torch.allclose(torch.tensor(result.per_image_rollout), generate_rollout(patterns), atol=1e-5)
    expected = torch.stack([generate_relevance([p[i] for p in patterns], [g[i] for g in grads]) for i in range(2)])
    assert torch.allclose(torch.tensor(result.per_image_relevance), expected, atol=1e-5)
    assert len(result.rollout_map) == 4 and len(result.rollout_prefix) == 1


@pytest.mark.parametrize("kind", ["dinov2_reg", "clip", "dinov3"])
def test_every_family_with_attention_maps_rolls_out(kind):
    if kind == "dinov3":  # RoPE, 4 registers, a 5-way head
        model, size = interp.load("vit_small_patch16_dinov3", pretrained=False, depth=2, img_size=64,
                                  num_classes=5), 64
    else:
        size = 56 if kind == "dinov2_reg" else 64
        model = make_model(kind, img_size=size)
    result = rollout_study(open_source(model=model, images=images(2, size=size)), progress=False)
    assert result.grid == [4, 4] and len(result.rollout_prefix) == (1 if kind == "clip" else 5)
    # Each rollout row is a distribution over the tokens: the CLS row's columns sum to 1.
    total = sum(map(sum, result.rollout_map)) + sum(result.rollout_prefix)
    assert total == pytest.approx(1.0, abs=1e-5)
    if kind == "dinov2_reg":
        assert result.relevance_map is None and "no head" in result.notes[0]
    else:
        assert torch.tensor(result.relevance_map).min() >= 0 and result.relevance_prefix[0] >= 1.0


@pytest.mark.parametrize("name", ["pvt_v2_b0", "swinv2_tiny_window8_256"])
def test_pyramids_are_refused_with_the_reason(name):
    why = refusal(SimpleNamespace(layout=load_skeleton(name).layout))
    assert "spatial-reduction or window attention" in why and "\n" not in why
