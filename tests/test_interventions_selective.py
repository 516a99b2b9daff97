"""selective_aggregate against a direct loop-based reference (numpy FFT, explicit per-channel loops)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.interventions import selective_aggregate
from interp.interventions.selective import low_pass


def reference_low_pass(vec: np.ndarray, sigma: float, fft: str) -> np.ndarray:
    """One patch vector [d] (float64) through the Gaussian low-pass, written out step by step."""
    d = vec.shape[0]
    if fft == "shift":
        spectrum = np.fft.fftshift(np.fft.fft(vec))
        window = np.array([np.exp(-((j - (d - 1) / 2) ** 2) / (2 * sigma ** 2)) for j in range(d)])
        return np.fft.ifft(np.fft.ifftshift(spectrum * window)).real
    spectrum = np.fft.rfft(vec)
    window = np.array([np.exp(-(f ** 2) / (2 * sigma ** 2)) for f in range(d // 2 + 1)])
    return np.fft.irfft(spectrum * window, n=d)


def reference_score(x: float, x_low: float, score: str, eps: float) -> float:
    if score == "paper":
        return x_low / (abs(x_low - x) + eps)
    if score == "code":
        return x / abs(x_low - x)
    return x_low / (x_low - x + eps)


def reference_aggregate(x: np.ndarray, k: int, sigma, score: str, fft: str, eps: float):
    """x [b, n, d] -> (g [b, d], votes [b, n]) with explicit loops over images, patches and channels."""
    b, n, d = x.shape
    sigma = np.sqrt(d) if sigma is None else sigma
    g, votes = np.zeros((b, d)), np.zeros((b, n))
    for i in range(b):
        low = np.stack([reference_low_pass(x[i, p], sigma, fft) for p in range(n)])
        for c in range(d):
            scores = [reference_score(x[i, p, c], low[p, c], score, eps) for p in range(n)]
            chosen = sorted(range(n), key=lambda p: -scores[p])[:k]
            g[i, c] = np.mean([x[i, p, c] for p in chosen])
            for p in chosen:
                votes[i, p] += 1
    return g, votes


@pytest.mark.parametrize("fft", ["shift", "rfft"])
@pytest.mark.parametrize("score", ["paper", "code", "contrib"])
@pytest.mark.parametrize("k", [1, 3])
def test_matches_loop_reference(score, fft, k):
    torch.manual_seed(0)
    x = torch.randn(2, 12, 24, dtype=torch.float64).float()
    g, votes = selective_aggregate(x, k=k, score=score, fft=fft)
    g_ref, votes_ref = reference_aggregate(x.double().numpy(), k, None, score, fft, 1e-6)
    np.testing.assert_allclose(g.numpy(), g_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(votes.numpy(), votes_ref)


def test_custom_sigma_and_odd_width():
    torch.manual_seed(1)
    x = torch.randn(1, 9, 15)
    g, votes = selective_aggregate(x, k=2, sigma=2.5, score="paper", fft="shift")
    g_ref, votes_ref = reference_aggregate(x.double().numpy(), 2, 2.5, "paper", "shift", 1e-6)
    np.testing.assert_allclose(g.numpy(), g_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(votes.numpy(), votes_ref)


def test_fft_variants_differ_slightly():
    torch.manual_seed(2)
    x = torch.randn(4, 196, 768)
    shift, rfft = low_pass(x, fft="shift"), low_pass(x, fft="rfft")
    rel = float((shift - rfft).norm() / shift.norm())
    assert 1e-5 < rel < 5e-3  # the half-bin offset of the reference window (SCIENCE.md: ~6e-4)


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
