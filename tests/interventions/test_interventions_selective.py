"""selective_aggregate and SelectiveCLS against the LaSt reference code (tests/reference/last_selective.py),
and the non-default variants against a loop-based float64 transcription of their formulas."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import images, make_model
from interp.interventions import SelectiveCLS, selective_aggregate
from interp.interventions.selective_aggregation import low_pass, shift_window
from reference.last_selective import gaussian_kernel_1d, reference_low_pass, reference_selective_cls

WIDTHS = [768, 384, 24, 15, 7]  # ViT-B, ViT-S, small even, odd widths


# ---------------------------------------------------------------------------------------------- reference equality
@pytest.mark.parametrize("d", WIDTHS)
def test_window_is_the_reference_kernel_and_peaks_left_of_zero_frequency(d):
    window = shift_window(d, d ** 0.5)
    torch.testing.assert_close(window, gaussian_kernel_1d(d, d ** 0.5), rtol=0, atol=0)
    # fftshift puts the zero frequency at d // 2; the reference kernel peaks one bin left of it for even d.
    assert int(window.argmax()) == (d // 2 - 1 if d % 2 == 0 else d // 2)
    assert float(window.max()) == 1.0


@pytest.mark.parametrize("d", WIDTHS)
def test_default_aggregate_equals_reference_on_random_tensors(d):
    torch.manual_seed(d)
    x = torch.randn(3, 49, d) * torch.rand(1, 1, d) * 3  # channels of different scales, like real features
    g, votes = selective_aggregate(x)
    g_ref, idx_ref = reference_selective_cls(x, k=1)
    torch.testing.assert_close(low_pass(x), reference_low_pass(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(g, g_ref, rtol=0, atol=0)  # the same gathered values
    votes_ref = torch.zeros(3, 49).scatter_add_(1, idx_ref.reshape(3, -1), torch.ones(3, d))
    torch.testing.assert_close(votes, votes_ref, rtol=0, atol=0)  # identical selected patches


@pytest.mark.parametrize("k", [2, 5])
def test_top_k_equals_reference_top_k(k):
    torch.manual_seed(k)
    x = torch.randn(2, 36, 96)
    g, votes = selective_aggregate(x, k=k)
    g_ref, idx_ref = reference_selective_cls(x, k=k)
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6)
    votes_ref = torch.zeros(2, 36).scatter_add_(1, idx_ref.reshape(2, -1), torch.ones(2, k * 96))
    torch.testing.assert_close(votes, votes_ref, rtol=0, atol=0)


@pytest.mark.parametrize("fam", ["vit", "dinov2_reg"])
def test_selective_cls_default_equals_reference_on_hooked_model(fam):
    """On the final normed patch tokens of a hooked timm ViT-S: g, selected patches and logits as the reference."""
    model, x = make_model(fam), images(3, seed=5)
    with model.intervene(SelectiveCLS()):
        out, cache = model.run_with_cache(x, names_filter=["hook_norm_final", "hook_selective_votes", "hook_pooled"])
    patches = cache["hook_norm_final"][:, model.layout.n_prefix:]
    g_ref, idx_ref = reference_selective_cls(patches, k=1)
    b, n, d = patches.shape
    votes_ref = torch.zeros(b, n).scatter_add_(1, idx_ref.reshape(b, -1), torch.ones(b, d))
    torch.testing.assert_close(cache["hook_selective_votes"], votes_ref, rtol=0, atol=0)
    m = model.timm_model
    torch.testing.assert_close(cache["hook_pooled"], m.fc_norm(g_ref), rtol=0, atol=1e-6)
    torch.testing.assert_close(out, m.head(m.fc_norm(g_ref)), rtol=0, atol=1e-5)


def test_old_centred_window_would_select_differently():
    """The test above can fail: a window centred at (d - 1) / 2 (the old code) changes some selections."""
    torch.manual_seed(0)
    x = torch.randn(4, 196, 384)
    j = torch.arange(384, dtype=torch.float64)
    centred = torch.exp(-((j - 383 / 2) ** 2) / (2 * 384.0)).float()
    spectrum = torch.fft.fftshift(torch.fft.fft(x, dim=-1), dim=-1) * centred
    x_low_centred = torch.fft.ifft(torch.fft.ifftshift(spectrum, dim=-1), dim=-1).real
    top_centred = (x / (x_low_centred - x).abs()).argmax(dim=1)
    _, idx_ref = reference_selective_cls(x)
    assert (top_centred != idx_ref[:, 0]).sum() > 0


# ---------------------------------------------------------------------------------------------- other variants
def loop_low_pass(vec: np.ndarray, sigma: float, fft: str) -> np.ndarray:
    """One patch vector [d] (float64) through the low-pass, written out step by step."""
    d = vec.shape[0]
    if fft == "shift":
        spectrum = np.fft.fftshift(np.fft.fft(vec))
        window = np.array([np.exp(-0.5 * (j / sigma) ** 2) for j in range(-(d // 2) + 1 - d % 2, d // 2 + 1)])
        return np.fft.ifft(np.fft.ifftshift(spectrum * window / window.max())).real
    spectrum = np.fft.rfft(vec)
    window = np.array([np.exp(-(f ** 2) / (2 * sigma ** 2)) for f in range(d // 2 + 1)])
    return np.fft.irfft(spectrum * window, n=d)


def loop_score(x: float, x_low: float, score: str, eps: float) -> float:
    if score == "paper":
        return x_low / (abs(x_low - x) + eps)
    if score == "code":
        return x / abs(x_low - x)
    return x_low / (x_low - x + eps)


def loop_aggregate(x: np.ndarray, k: int, sigma, score: str, fft: str, eps: float):
    """x [b, n, d] -> (g [b, d], votes [b, n]) with explicit loops over images, patches and channels."""
    b, n, d = x.shape
    sigma = np.sqrt(d) if sigma is None else sigma
    g, votes = np.zeros((b, d)), np.zeros((b, n))
    for i in range(b):
        low = np.stack([loop_low_pass(x[i, p], sigma, fft) for p in range(n)])
        for c in range(d):
            scores = [loop_score(x[i, p, c], low[p, c], score, eps) for p in range(n)]
            chosen = sorted(range(n), key=lambda p: -scores[p])[:k]
            g[i, c] = np.mean([x[i, p, c] for p in chosen])
            for p in chosen:
                votes[i, p] += 1
    return g, votes


@pytest.mark.parametrize("fft", ["shift", "rfft"])
@pytest.mark.parametrize("score", ["paper", "code", "contrib"])
@pytest.mark.parametrize("k,d", [(1, 24), (3, 24), (2, 15)])
def test_every_variant_matches_loop_transcription(score, fft, k, d):
    torch.manual_seed(k + d)
    x = torch.randn(2, 12, d)
    g, votes = selective_aggregate(x, k=k, score=score, fft=fft)
    g_ref, votes_ref = loop_aggregate(x.double().numpy(), k, None, score, fft, 1e-6)
    np.testing.assert_allclose(g.numpy(), g_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(votes.numpy(), votes_ref)


def test_custom_sigma_and_odd_width():
    torch.manual_seed(1)
    x = torch.randn(1, 9, 15)
    g, votes = selective_aggregate(x, k=2, sigma=2.5, score="paper", fft="shift")
    g_ref, votes_ref = loop_aggregate(x.double().numpy(), 2, 2.5, "paper", "shift", 1e-6)
    np.testing.assert_allclose(g.numpy(), g_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(votes.numpy(), votes_ref)


def test_fft_variants_differ_slightly():
    torch.manual_seed(2)
    x = torch.randn(4, 196, 768)
    shift, rfft = low_pass(x, fft="shift"), low_pass(x, fft="rfft")
    rel = float((shift - rfft).norm() / shift.norm())
    assert 1e-4 < rel < 2e-3  # the reference window is one bin off centre (docs/methods.md section 3: ~4e-4..8e-4)


# ---------------------------------------------------------------------------------------------- properties
def test_k_equal_n_is_average_pooling():
    x = torch.randn(3, 50, 64)
    g, votes = selective_aggregate(x, k=50)
    torch.testing.assert_close(g, x.mean(dim=1), rtol=1e-5, atol=1e-6)
    assert torch.all(votes == 64)


def test_gradients_reach_exactly_the_selected_tokens():
    x = torch.randn(2, 20, 32, requires_grad=True)
    g, votes = selective_aggregate(x, k=2)
    g.sum().backward()
    # d g[b, c] / d x[b, p, c] = 1/k for the k chosen patches of channel c, else 0.
    chosen = x.grad != 0
    assert torch.all(x.grad[chosen] == 0.5)
    assert torch.all(chosen.sum(dim=1) == 2)
    torch.testing.assert_close(chosen.sum(dim=2).float(), votes)
    assert torch.all(votes.sum(-1) == 2 * 32)


def test_votes_sum_to_d_for_k1_and_shapes():
    x = torch.randn(5, 49, 96)
    g, votes = selective_aggregate(x)
    assert g.shape == (5, 96) and votes.shape == (5, 49)
    assert torch.all(votes.sum(-1) == 96)


def test_low_precision_input_keeps_its_dtype():
    x = torch.randn(2, 16, 32)
    g16, votes16 = selective_aggregate(x.bfloat16())
    assert g16.dtype == torch.bfloat16 and votes16.dtype == torch.float32
    assert torch.all(votes16.sum(-1) == 32)


def test_bad_arguments():
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="k=5"):
        selective_aggregate(x, k=5)
    with pytest.raises(ValueError, match="score"):
        selective_aggregate(x, score="nope")
    with pytest.raises(ValueError, match="fft"):
        selective_aggregate(x, fft="dct")
    with pytest.raises(ValueError, match=r"\[b, n, d\]"):
        selective_aggregate(x[0])
