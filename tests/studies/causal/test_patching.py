"""Activation and attribution patching: equal to TransformerLens's patching arithmetic (tests/reference/
tl_patching.py) on a random ViT; on planted_vit they locate the blocks, positions and neurons of the planted
circuit, and the linear estimate agrees with the real sweep where the circuit is linear; every family runs."""
from __future__ import annotations

import pytest
import torch

import interp
from conftest import REPO, images, make_model, one_error_line
from interp.cli import main
from interp.models import planted_truth
from interp.runtime.open import open_source
from interp.studies.causal.attribution import attribution_study
from interp.studies.causal.patching import patching_study
from interp.studies.causal.sweep import spearman
from reference.tl_patching import (generic_activation_patch, layer_head_vector_patch_setter, layer_pos_patch_setter,
                                   normalized, rows)
from interp.detection.spec import DetectionSpec


def logit_diff(logits):
    return (logits[:, 0] - logits[:, 1]).mean()


@pytest.mark.parametrize("hook, setter, leaf", [("resid_post", layer_pos_patch_setter, "hook_resid_post"),
                                                ("z", layer_head_vector_patch_setter, "attn.hook_z")])
def test_sweeps_equal_transformer_lens(hook, setter, leaf):
    model = make_model("vit", img_size=32)  # a 2 x 2 grid: 5 tokens
    x = images(2, size=32)
    corrupted = x.clone()
    corrupted[..., 8:24, 0:16] = 0  # --box 0,8,16,24: the box filled with the mean colour
    result = patching_study(open_source(model=model, images=x), site=hook, corruption="region", box=(0, 8, 16, 24),
                            metric="logit-diff",
                            classes=(0, 1), cells=4, progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        clean, bad = logit_diff(model(x)), logit_diff(model(corrupted))
    n = 5 if hook == "resid_post" else 6
    expected = generic_activation_patch(model, corrupted, cache, logit_diff, setter,
                                        lambda layer: f"blocks.{layer}.{leaf}", rows([0, 1], n)).view(2, n)
    assert torch.allclose(torch.tensor(result.values), expected, atol=1e-5, rtol=1e-5)
    assert torch.allclose(torch.tensor(result.normalized), normalized(expected, clean, bad), atol=1e-4, rtol=1e-4)
    assert abs(result.clean - float(clean)) < 1e-5 and abs(result.corrupted - float(bad)) < 1e-5
    assert result.cells[0][:2] == (["CLS", "patch (0, 0)"] if hook == "resid_post" else ["head 0", "head 1"])


@pytest.fixture(scope="module")
def planted():
    """planted_vit at 64 px (a 4 x 4 grid) and two noise images with one flat patch each: the artifacts."""
    model = interp.load("planted_vit", img_size=64)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    x[0, :, 16:32, 16:32] = 0.3  # patch (1, 1): token 6
    x[1, :, 32:48, 48:64] = -0.2  # patch (2, 3): token 12
    mask = planted_truth(model).artifact_mask(model.timm_model, x)
    assert mask.flatten(1).nonzero().tolist() == [[0, 5], [1, 11]]
    return open_source(model=model, images=x, batch_size=2)


def test_patching_locates_the_planted_blocks_and_positions(planted):
    result = patching_study(planted, detection=DetectionSpec(threshold=300.0), site="mlp_out", metric="outliers", corruption="noise", noise=0.5, cells=17, progress=False)  # ordinary tokens ~142, artifacts ~616
    assert result.clean == 1.0 and result.corrupted == 0.0  # one artifact per clean image, none once textured
    effect = torch.tensor(result.normalized)
    # Only block 0's MLP (the texture energy) and block 2's (the register neurons), only at the flat patches.
    assert effect.abs().sum(1).nonzero().flatten().tolist() == [0, 2]
    for block in (0, 2):
        assert effect[block].nonzero().flatten().tolist() == [6, 12] and torch.allclose(effect[block, [6, 12]],
                                                                                        torch.tensor(0.5))
    assert result.peak()["block"] in (0, 2)
    # The attention check: per block, the clean CLS row (every token) and its rank correlation with the effects.
    assert len(result.attention) == 6 and all(len(row) == 17 for row in result.attention)
    assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in result.attention)
    rank = spearman(torch.tensor(result.attention[2][1:]), effect[2, 1:])
    assert result.attention_rank[2] == pytest.approx(rank) and result.attention_rank[5] is None  # no effect there
    # Noising: the corrupted (textured) MLP output at a flat patch removes that image's artifact.
    noised = patching_study(planted, detection=DetectionSpec(threshold=300.0), site="mlp_out", blocks=(2,), direction="noise", metric="outliers",
                            corruption="noise", noise=0.5, cells=17, progress=False)
    assert torch.tensor(noised.values[0])[[6, 12]].tolist() == [0.5, 0.5] and noised.values[0][0] == 1.0
    assert noised.normalized[0][6] == 0.5 and noised.normalized[0][0] == 0.0


def test_spearman_averages_ties():
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([1.0, 3, 2, 4])) == pytest.approx(0.8)
    a, b = torch.tensor([1.0, 2, 2, 3, 0, 0, 5]), torch.tensor([0.0, 1, 1, 0, 3, 3, 2])
    assert spearman(a, b) == pytest.approx(-0.46731012841003694)  # scipy.stats.spearmanr
    assert spearman(a, torch.zeros(7)) is None


def test_attribution_finds_the_planted_neurons_only_where_the_effect_is_linear(planted):
    truth = planted_truth(planted.model)
    listed = sorted(truth.neurons) + [3, 50, 200]
    neurons = ",".join(f"2:{n}" for n in listed)
    result = attribution_study(planted, site="mlp_post", neurons=neurons, corruption="noise", noise=0.5,
                               progress=False)
    order = [int(label.split()[1]) for label in result.cells[0]]  # "neuron 17", in index order
    assert sorted(order) == sorted(listed)
    real = dict(zip(order, result.patched_normalized[0]))
    assert min(real[n] for n in truth.neurons) > 0.3 and max(abs(real[n]) for n in (3, 50, 200)) < 1e-3
    # The register neurons fire past a threshold: the first-order estimate misses most of their effect.
    estimated = dict(zip(order, result.normalized[0]))
    assert max(abs(estimated[n]) for n in truth.neurons) < 0.5 * min(real[n] for n in truth.neurons)
    # The heads write linearly into the output: there the estimate is the real patching effect.
    heads = attribution_study(planted, site="z", metric="logit-diff", classes=(0, 1), corruption="noise", noise=0.5,
                              progress=False)
    assert heads.correlation > 0.99


@pytest.mark.parametrize("kind", ["dinov2_reg", "clip", "dinov3", "pvt"])
def test_every_family_patches_and_attributes(kind):
    if kind == "dinov3":
        model, size = interp.load("vit_small_patch16_dinov3", pretrained=False, depth=2, img_size=64), 64
    elif kind == "pvt":
        model, size = interp.load("pvt_v2_b0", pretrained=False, img_size=64), 64
    else:
        size = 56 if kind == "dinov2_reg" else 64
        model = make_model(kind, img_size=size)
    source = open_source(model=model, images=images(2, size=size))
    result = attribution_study(source, site="z", blocks=(1,), corruption="noise", progress=False)
    heads = model.family.n_heads(1)
    assert result.cells == [[f"head {h}" for h in range(heads)]] and result.clean == pytest.approx(1.0)
    assert len(result.patched[0]) == heads and all(v == v for v in result.patched[0] + result.values[0])


@pytest.mark.parametrize("args, words", [
    (["patching", "--site", "mlp_post"], "--neurons goes with --site mlp_post"),
    (["attribution", "--metric", "outliers"], "has no gradient"),
    (["patching", "--metric", "logit-diff"], "needs --classes A,B"),
    (["patching", "--corruption", "region"], "takes one of --box, --boxes or --masks"),
    (["patching", "--box", "1,1,8,8"], "takes one of --box, --boxes or --masks"),
    (["patching", "--box", "5,5,2,9", "--corruption", "region"], "x0 < x1"),
    (["patching", "--fill", "blur"], "--fill and --blur-sigma go with --corruption region"),
    (["patching", "--corruption", "region", "--box", "1,1,8,8", "--blur-sigma", "2"], "--blur-sigma goes with"),
    (["patching", "--corruption", "test-time-register"], "--register-neurons goes with"),
    (["attribution", "--classifier", "README.md"], "is read by --metric logit-diff or prob"),
])
def test_options_that_cannot_go_together_are_one_line(args, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "o"
    assert main(["study", args[0], "planted_vit", "--images", "interp/data/samples", "--out", str(out),
                 *args[1:]]) == 2
    assert words in one_error_line(capsys.readouterr().err) and not out.exists()
