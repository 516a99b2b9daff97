"""planted_dinov3 (the planted circuit in a small model of DINOv3's architecture, timm's ``Eva``): the artifact
studies recover what was planted (neurons ranks the planted neurons first, norms finds exactly the planted tokens,
ablate removes them against random controls, a test-time register moves them), a patch file reproduces the edit
on a plain timm model, and the same architecture without the plant has no artifacts."""
from __future__ import annotations

import copy

import pytest
import torch

import interp
from interp import _model_names
from interp.interventions import TestTimeRegister
from interp.interventions.export import apply_interventions
from interp.models import planted_truth
from interp.models.families import EvaFamily
from interp.models.planted import PLANTED_BUILDERS
from interp.studies import open_source
from interp.studies.artifacts.ablate import ablate_study
from interp.studies.artifacts.neurons import neurons_study
from interp.studies.artifacts.norms import norms_study
from interp.studies.artifacts.registers import registers_study
from interp.studies.artifacts.relocate import relocate_study
from interp.studies.core.stats import iou


def constructed_images() -> torch.Tensor:
    """Gaussian-noise images (textured everywhere) with flat squares at known places (patch size 16)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 224, 224, generator=g)
    x[0, :, :64, :64] = 0.4                                   # 4x4 patches, top left
    x[1, :, 96:160, 32:224] = -0.3                            # 4x12 band
    x[2, :, 160:224, 160:224] = 0.2                           # 4x4 bottom right ...
    x[2, :, 0:32, 96:128] = -0.1                              # ... and 2x2 at the top
    return x


@pytest.fixture(scope="module")
def planted():
    return interp.load("planted_dinov3")


@pytest.fixture(scope="module")
def pixels():
    return constructed_images()


@pytest.fixture(scope="module")
def source(planted, pixels):
    return open_source(model=planted, images=pixels, batch_size=2)  # 2: a batch boundary inside the set


@pytest.fixture(scope="module")
def norms(source):
    return norms_study(source, progress=False)


@pytest.fixture(scope="module")
def planted_neurons(planted):
    truth = planted_truth(planted)
    return {truth.layer: list(truth.neurons)}


def test_planted_dinov3_is_an_eva_with_registers_and_layerscale(planted):
    assert isinstance(planted.family, EvaFamily) and planted.model_name == "planted_dinov3"
    lay = planted.layout
    assert (lay.n_prefix, lay.n_registers, lay.cls_index, lay.grid) == (5, 4, 0, (14, 14))
    truth = planted_truth(planted)
    block = planted.timm_model.blocks[truth.layer]
    assert block.gamma_2 is not None and planted.timm_model.rope is not None
    writes = planted.neuron_writes(truth.layer)
    for n in truth.neurons:  # the write direction includes LayerScale: gamma_2 * fc2[:, n], 5x fc2's column
        torch.testing.assert_close(writes[:, n], block.gamma_2 * block.mlp.fc2.weight[:, n])
        assert writes[:, n].norm() > 4 * block.mlp.fc2.weight[:, n].norm()
    assert _model_names.PLANTED_NAMES == tuple(PLANTED_BUILDERS)
    with pytest.raises(interp.errors.ModelLoadError, match="takes no weight file"):
        interp.load("planted_dinov3", weights="x.safetensors")


def test_norms_study_finds_exactly_the_planted_tokens(planted, pixels, norms):
    truth = planted_truth(planted)
    expected = truth.artifact_mask(planted.timm_model, pixels)
    assert int(expected.sum()) == 16 + 48 + 20
    found = norms.outlier_map_tensor()
    assert norms.artifacts_found and norms.threshold is not None
    assert all(iou(f, e) >= 0.9 for f, e in zip(found, expected))
    assert norms.emergence["layer"] == truth.layer and norms.emergence["component"] == "mlp"
    fractions = norms.outlier_fraction_per_layer
    assert all(f == 0 for f in fractions[:truth.layer]) and all(f > 0 for f in fractions[truth.layer:])
    attn = norms.cls_attention_max  # the planted attention sinks (through RoPE) start one block later
    assert min(attn[truth.layer + 1:]) > 10 * max(attn[:truth.layer + 1])


def test_neurons_study_ranks_the_planted_neurons_first(planted, source):
    truth = planted_truth(planted)
    k = len(truth.neurons)
    result = neurons_study(source, top_k=k + 2, progress=False)
    assert {(e["layer"], e["neuron"]) for e in result.neurons[:k]} == {(truth.layer, n) for n in truth.neurons}
    scores = [e["score"] for e in result.neurons]
    assert min(scores[:k]) > 3 * max(scores[k:])


def test_ablating_the_planted_neurons_removes_the_tokens_but_random_controls_do_not(source, planted_neurons, norms):
    result = ablate_study(source, neurons=planted_neurons, controls=3, seed=0, progress=False)
    counts = result.summary["outlier_count"]
    assert counts["baseline"] == sum(norms.outlier_counts) > 0
    assert counts["target"] == 0
    controls = [result.conditions[f"control_{i}"]["outlier_count"] for i in range(3)]
    assert all(c >= 0.9 * counts["baseline"] for c in controls)


def test_relocation_puts_the_tokens_on_the_smiley(planted, source, planted_neurons):
    from interp.interventions import masks

    result = relocate_study(source, neurons=planted_neurons, progress=False)
    assert result.target == masks.smiley(planted.layout.grid).int().tolist()
    assert min(result.iou) >= 0.9 and result.cls_attention_argmax_on_target == 1.0


def test_test_time_register_moves_the_high_norm_off_the_patches(source, planted_neurons, norms):
    result = registers_study(source, neurons=planted_neurons, progress=False)
    assert result.baseline["outlier_count"] == sum(norms.outlier_counts) > 0
    assert result.with_register["outlier_count"] == 0
    assert min(result.register_norm) > result.threshold > result.with_register["max_patch_norm"]


def test_the_patch_file_reproduces_the_register_on_a_plain_timm_model(planted, pixels, planted_neurons):
    ttr = [TestTimeRegister(planted_neurons)]
    with torch.no_grad(), planted.intervene(*ttr):
        hooked = planted.forward_features(pixels)  # [b, t + 1, d]: the register is a token
    with torch.no_grad():
        plain = apply_interventions(copy.deepcopy(planted.timm_model), ttr).forward_features(pixels)
        base = planted.forward_features(pixels)
    assert plain.shape == hooked.shape == (3, planted.layout.n_tokens + 1, planted.d_model)
    assert (plain - hooked).abs().max() <= 1e-4 * hooked.abs().max()
    n_prefix = planted.layout.n_prefix
    assert (hooked[:, n_prefix + 1:] - base[:, n_prefix:]).abs().max() > 0.1  # the edit changes the patches


def test_the_same_architecture_without_the_plant_has_no_artifacts():
    model = interp.load("vit_small_patch16_dinov3", pretrained=False, depth=4, embed_dim=192, num_heads=3,
                        img_size=224, init_values=0.5)
    noise = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    norms = norms_study(open_source(model=model, images=noise), progress=False)
    assert not norms.artifacts_found and sum(norms.outlier_counts) == 0


def test_the_explorer_session_on_planted_dinov3(planted):
    pytest.importorskip("starlette", reason="the explore extra is not installed")
    from interp.explore.session import ExploreSession
    from interp.models import sample_image_paths

    session = ExploreSession(planted, sample_image_paths())
    info = session.info()
    assert info["planted"]["neurons"] == [17, 101, 402, 655] and info["grid"] == [14, 14]
    assert info["threshold"]["artifacts_found"]
    spec = [{"kind": "TestTimeRegister", "neurons": {"2": [17, 101, 402, 655]}}]
    none, ttr = session.run(0), session.run(0, spec)
    assert none["prefix_labels"] == ["CLS", "register 0", "register 1", "register 2", "register 3"]
    assert ttr["prefix_labels"][-1] == "test-time register 0"
    assert none["outlier_count"] > 0 and ttr["outlier_count"] == 0
