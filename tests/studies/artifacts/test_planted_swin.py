"""The planted Swin-v2 (interp.models.planted_swin): the studies find what was planted in stage 3, on that stage's
grid, through Swin-v2's residual post-norms and patch mergings; the same architecture without the plant has no
artifacts."""
from __future__ import annotations

import pytest
import torch

import interp
from interp.errors import InterpError
from interp.models.planted import PlantedSwinTruth, planted_swin, planted_truth
from interp.studies import open_source
from planted_pyramid_checks import PLANTED, check_ablation_against_random_controls, check_patch_file_on_plain_timm



@pytest.fixture(scope="module")
def planted():
    model = interp.load("planted_swin")
    return model, open_source(model=model, images=interp.models.sample_image_paths(), batch_size=4)


def test_the_truth_names_stage_3(planted):
    model, source = planted
    truth = planted_truth(model)
    assert isinstance(truth, PlantedSwinTruth) and (truth.stage, truth.block, truth.layer) == (3, 0, 6)
    assert model.block_names.prefixes[truth.layer] == "layers.3.blocks.0"
    assert model.layout.stage_grids == ((56, 56), (28, 28), (14, 14), (7, 7))
    mask = torch.cat([truth.artifact_mask(model, x) for _, x in source.image_batches()])
    assert mask.shape == (4, 7, 7) and 0 < int(mask.sum()) < mask.numel() // 4  # some flat regions, not most
    with pytest.raises(ValueError, match="computes the texture"):
        planted_swin(stage=0, block=0)


def test_norms_finds_the_planted_tokens_at_the_planted_stage(planted):
    from interp.studies.artifacts.norms import norms_study

    model, source = planted
    truth = planted_truth(model)
    result = norms_study(source, progress=False)
    assert result.artifacts_found and result.grid == [7, 7]
    found = result.outlier_map_tensor()
    energy = torch.cat([truth.texture_energy(model, x) for _, x in source.image_batches()])
    assert found[energy < truth.tau / 4].all() and not found[energy > truth.tau].any()  # clearly flat / textured
    mask = torch.cat([truth.artifact_mask(model, x) for _, x in source.image_batches()])
    assert (found == mask).float().mean() >= 0.95
    assert result.blocks[6] == "stage 3 block 0"
    assert all(f == 0 for f in result.outlier_fraction_per_layer[:6]) and result.outlier_fraction_per_layer[6] > 0
    emerged = result.emergence_detected
    assert (emerged["layer"], emerged["component"]) == (6, "mlp") and emerged["separation"] >= 2


def test_neurons_ranks_the_planted_neurons_first(planted):
    from interp.studies.artifacts.neurons import neurons_study

    _, source = planted
    result = neurons_study(source, top_k=4, progress=False)
    assert result.artifacts_found and result.neuron_dict() == {6: PLANTED}
    assert result.lowest_layer == 6  # the outliers are stage 3's tokens: its blocks only are scored


def test_ablating_the_planted_neurons_removes_the_artifacts_against_random_controls(planted):
    check_ablation_against_random_controls(planted[1])


def test_a_patch_file_reproduces_the_ablation_on_plain_timm(planted, tmp_path):
    check_patch_file_on_plain_timm(*planted, planted_swin, tmp_path)


def test_test_time_registers_refuse_in_one_line(planted):
    from interp.studies.artifacts.registers import registers_study

    _, source = planted
    with pytest.raises(InterpError, match="test-time registers are not defined for .*Swin") as e:
        registers_study(source, neurons="6:17,6:101", progress=False)
    assert "\n" not in str(e.value)
