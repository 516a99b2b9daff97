"""On the planted ViT (register neurons by construction): the test-time register takes the high norm out of
the patches, and AttentionBias reproduces the test-time register on held-out images.

Measured (calibration: 24 synthetic images; held-out: 6 synthetic + the 4 bundled photos):
AttentionBias vs TestTimeRegister, extra key/value at every block: logits max |diff| 1.1e-6, final
features relative error 2.2e-6 (pooled vector and patch tokens), while the test-time register itself moves
the final patch tokens by ~124 % and the logits by ~6e-3. Applying it only from the register-neuron layer
on is ~25x worse (logits 2.4e-5, features 5.9e-5): the register token's key is not zero in earlier blocks
even though its input is. Stated tolerance (asserted): logits 1e-5 absolute, features 2e-5 relative.
"""
from __future__ import annotations

import pytest
import torch

import interp
from interp.interventions import AttentionBias, TestTimeRegister
from interp.models import planted_truth, sample_image_paths


def flat_and_textured(n: int, seed: int) -> torch.Tensor:
    """Images of 7x7 blocks of 32 px: flat colour blocks (high-norm tokens in the planted model) and noisy ones."""
    g = torch.Generator().manual_seed(seed)
    colour = (torch.rand(n, 3, 7, 7, generator=g) * 2 - 1).repeat_interleave(32, 2).repeat_interleave(32, 3)
    textured = (torch.rand(n, 1, 7, 7, generator=g) < 0.5).float().repeat_interleave(32, 2).repeat_interleave(32, 3)
    return colour + textured * 0.5 * torch.randn(n, 3, 224, 224, generator=g)


@pytest.fixture(scope="module")
def planted():
    model = interp.load("planted_vit")
    held_out = torch.cat([flat_and_textured(6, seed=2), interp.load_images(sample_image_paths(), model)])
    return model, flat_and_textured(24, seed=1), held_out


def test_test_time_register_moves_the_high_norm_into_the_register(planted):
    model, _, x = planted
    truth = planted_truth(model)  # the ground truth lives with the planted model
    layer, neurons = truth.layer, list(truth.neurons)
    name = f"blocks.{layer}.hook_resid_post"
    with torch.no_grad():
        _, base = model.run_with_cache(x, names_filter=name)
        with model.intervene(TestTimeRegister({layer: neurons})):
            _, moved = model.run_with_cache(x, names_filter=name)
    n_prefix = model.layout.n_prefix
    base_norm = base[name][:, n_prefix:].norm(dim=-1)  # [b, n]
    normal = base_norm.median()
    high = base_norm > 2 * normal
    assert high.sum() > 50  # the planted high-norm tokens exist without the edit...
    artifacts = truth.artifact_mask(model.timm_model, x).reshape(len(x), -1)
    textured = truth.texture_energy(model.timm_model, x).reshape(len(x), -1) > 2 * truth.tau
    assert torch.all(high[artifacts])  # ...on every patch the ground truth names...
    assert textured.sum() > 500 and not (high & textured).any()  # ...and never on strongly textured ones
    patch_norm = moved[name][:, n_prefix + 1:].norm(dim=-1)
    register_norm = moved[name][:, n_prefix].norm(dim=-1)
    assert patch_norm.max() < 1.2 * normal  # no high-norm patch is left...
    assert torch.all(register_norm > 2 * normal)  # ...the register token of every image carries a high norm


def test_attention_bias_reproduces_the_test_time_register(planted):
    model, calibration, x = planted
    truth = planted_truth(model)
    neurons = {truth.layer: list(truth.neurons)}
    names = ["hook_norm_final", "hook_pooled"]
    with torch.no_grad():
        base_logits, base = model.run_with_cache(x, names_filter=names)
        with model.intervene(TestTimeRegister(neurons)):
            ttr_logits, ttr = model.run_with_cache(x, names_filter=names)
        errors = {}
        for label, layers in (("every block", None), ("from the register layer", range(truth.layer, 6))):
            bias = AttentionBias.calibrate(model, calibration, neurons, batch_size=8, layers=layers)
            with model.intervene(bias):
                logits, cache = model.run_with_cache(x, names_filter=names)
            n_prefix = model.layout.n_prefix
            patches, ttr_patches = cache["hook_norm_final"][:, n_prefix:], ttr["hook_norm_final"][:, n_prefix + 1:]
            errors[label] = dict(
                logits=float((logits - ttr_logits).abs().max()),
                pooled=float(((cache["hook_pooled"] - ttr["hook_pooled"]).norm(dim=-1)
                              / ttr["hook_pooled"].norm(dim=-1)).max()),
                patches=float(((patches - ttr_patches).norm(dim=-1) / ttr_patches.norm(dim=-1)).max()),
            )
    effect_patches = float(((base["hook_norm_final"][:, 1:] - ttr["hook_norm_final"][:, 2:]).norm(dim=-1)
                            / ttr["hook_norm_final"][:, 2:].norm(dim=-1)).max())
    effect_logits = float((base_logits - ttr_logits).abs().max())
    best = errors["every block"]
    # Stated tolerance: logits within 1e-5 absolute, final features within 2e-5 relative.
    assert best["logits"] < 1e-5 and best["pooled"] < 2e-5 and best["patches"] < 2e-5, errors
    assert best["patches"] < 1e-3 * effect_patches and best["logits"] < 0.05 * effect_logits
    # Every block is the closer choice (the register's key is not zero before the register layer).
    later = errors["from the register layer"]
    assert best["patches"] <= later["patches"] and best["logits"] <= later["logits"], errors
