"""A neuron's write direction where a LayerNorm sits between it and the residual stream (issue 47 item 6): on a
random EVA02 with its inner MLP norm (``scale_mlp``) and a random Swin-v2 (residual post-norm), the reported write
equals the measured change of the residual per unit nudge of the neuron's activation, averaged over the tokens
(central finite difference); fc2's column alone (what was reported before) does not. LayerScale stays exact."""
from __future__ import annotations

import pytest
import torch

import interp
from conftest import images, make_model
from interp.errors import InterpError
from interp.runtime.open import open_source

NEURONS = (3, 40, 77)


def _eva02():
    model = interp.load("eva02_tiny_patch14_224", pretrained=False, seed=0, depth=2, img_size=56, scale_mlp=True)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # timm starts the inner norm at weight 1, bias 0: spread them
        for block in model.timm_model.blocks:
            block.mlp.norm.weight.copy_(1 + 0.5 * torch.randn(block.mlp.norm.weight.shape, generator=g))
            block.mlp.norm.bias.copy_(0.1 * torch.randn(block.mlp.norm.bias.shape, generator=g))
    return model


def _swin():
    model = interp.load("swinv2_tiny_window8_256", pretrained=False, seed=0, img_size=64, embed_dim=24,
                        depths=(2, 2, 2, 2), num_heads=(1, 2, 3, 4), window_size=4)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # timm starts the post-norms at zero (every block a no-op)
        for _, block in model.family.blocks():
            for norm in (block.norm1, block.norm2):
                norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=g))
                norm.bias.copy_(0.1 * torch.randn(norm.bias.shape, generator=g))
    return model


def _measured(model, x, layer: int, neuron: int, eps: float) -> torch.Tensor:
    """mean over tokens of d resid_post / d a_n: central difference of a nudge of neuron ``neuron`` on every
    token (float64)."""
    post, out = model.block_names.hook(layer, "mlp.hook_post"), model.block_names.hook(layer, "hook_resid_post")

    def run(delta):
        def nudge(a, hook):
            a = a.clone()
            a[..., neuron] += delta
            return a

        with torch.no_grad():
            model.run_with_hooks(x, fwd_hooks=[(post, nudge), (out, lambda r, hook: store.append(r))])
        return store.pop()

    store = []
    diff = (run(eps) - run(-eps)) / (2 * eps)
    return diff.reshape(-1, diff.shape[-1]).mean(0)


@pytest.mark.parametrize("build, layer", [(_eva02, 1), (_swin, 2)], ids=["eva02-scale-mlp", "swinv2-post-norm"])
def test_the_write_through_a_norm_is_the_measured_change(build, layer, one_thread):
    model = build().double()
    x = images(2, size=model.img_size[0]).double()
    assert model.write_note(layer) and "linearised" in model.write_note(layer)
    post = model.block_names.hook(layer, "mlp.hook_post")
    _, cache = model.run_with_cache(x, names_filter=post)
    with pytest.raises(InterpError, match="operating point"):
        model.neuron_writes(layer)  # without activations it is not a direction
    reported = model.neuron_writes(layer, cache[post]).double()
    fc2 = model.family.mlp(layer).fc2.weight.detach().double()
    for n in NEURONS:
        measured = _measured(model, x, layer, n, eps=1e-4)
        assert torch.linalg.vector_norm(reported[:, n] - measured) <= 1e-3 * measured.norm(), n
        before = fc2[:, n]
        cos = float(before @ measured / (before.norm() * measured.norm()))
        # fc2's column alone: off in length (and direction through the post-norm)
        assert abs(float(before.norm() / measured.norm()) - 1) > 0.05 or cos < 0.99, n
    # the same through an activation source (the SAE rule's path): its own images are the operating point
    source = open_source(model=model.float(), images=x.float(), batch_size=2)
    from_source = source.neuron_writes(layer)
    torch.testing.assert_close(from_source, reported.float(), rtol=1e-4, atol=1e-5)


def test_layerscale_writes_stay_exact():
    """A DINOv2 block (LayerScale, no norm between): no note, no operating point needed, gamma * fc2."""
    model = make_model("dinov2")
    block = model.timm_model.blocks[1]
    assert model.write_note(1) is None
    torch.testing.assert_close(model.neuron_writes(1), block.mlp.fc2.weight * block.ls2.gamma[:, None])
