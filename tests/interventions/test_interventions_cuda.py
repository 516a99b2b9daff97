"""Interventions on a CUDA device match the CPU (run with ``pytest -m cuda``; skipped without a GPU)."""
from __future__ import annotations

import copy

import pytest
import torch

from interp.interventions import export as patch
from conftest import images, make_model
from interp.interventions import AttentionBias, SelectiveCLS, TestTimeRegister, selective_aggregate

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def on_cuda(model):
    return copy.deepcopy(model).to("cuda")


@pytest.mark.parametrize("score,fft", [("paper", "shift"), ("code", "rfft"), ("contrib", "shift")])
def test_selective_aggregate_cuda_matches_cpu(score, fft):
    x = torch.randn(4, 196, 384)
    g_cpu, votes_cpu = selective_aggregate(x, k=3, score=score, fft=fft)
    g_gpu, votes_gpu = selective_aggregate(x.cuda(), k=3, score=score, fft=fft)
    assert g_gpu.device.type == "cuda" and votes_gpu.device.type == "cuda"
    torch.testing.assert_close(g_gpu.cpu(), g_cpu, rtol=1e-5, atol=1e-5)
    assert (votes_gpu.cpu() == votes_cpu).float().mean() > 0.999  # FFT rounding may flip a near tie


@pytest.mark.parametrize("family", ["vit", "dinov2_reg", "clip"])
def test_selective_cls_and_test_time_register_cuda_match_cpu(family):
    model, x = make_model(family), images(4)
    gpu = on_cuda(model)
    for interventions in ([SelectiveCLS(k=2)], [TestTimeRegister({0: [3, 4], 1: [9]})],
                          [TestTimeRegister({0: [3]}, patch_fill="outliers"), SelectiveCLS(k=1, fft="rfft")]):
        with torch.no_grad():
            cpu_out = model.run_with_interventions(x, interventions)
            gpu_out = gpu.run_with_interventions(x.cuda(), interventions)
        torch.testing.assert_close(gpu_out.cpu(), cpu_out, rtol=1e-3, atol=1e-3)


def test_attention_bias_and_patch_on_cuda(tmp_path):
    model, calib, x = make_model("vit"), images(4, seed=1), images(4)
    gpu = on_cuda(model)
    bias = AttentionBias.calibrate(gpu, calib, {0: [3, 4]})
    path = patch.save([bias, TestTimeRegister({1: [5]}), SelectiveCLS()], tmp_path / "p.safetensors", model)
    plain = patch.apply(copy.deepcopy(model.timm_model), path).cuda()
    with torch.no_grad():
        expected = gpu.run_with_interventions(x.cuda(), patch.load(path))
        torch.testing.assert_close(plain(x.cuda()), expected, rtol=1e-4, atol=1e-4)
        cpu = model.run_with_interventions(x, patch.load(path))
    torch.testing.assert_close(expected.cpu(), cpu, rtol=1e-3, atol=1e-3)


def test_bfloat16_runs_on_cuda():
    model, x = make_model("vit"), images(2)
    gpu = on_cuda(model).to(torch.bfloat16)
    with torch.no_grad():
        out = gpu.run_with_interventions(x.cuda().bfloat16(), [TestTimeRegister({0: [3]}), SelectiveCLS()])
        ref = model.run_with_interventions(x, [TestTimeRegister({0: [3]}), SelectiveCLS()])
    assert out.dtype == torch.bfloat16
    assert float((out.float().cpu() - ref).abs().max()) < 0.1 * float(ref.abs().max()) + 0.1
