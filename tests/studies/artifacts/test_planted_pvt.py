"""The planted PVTv2 (interp.models.planted_pvt): the studies find what was planted in stage 3, on that stage's
grid; the same architecture without the plant has no artifacts; studies undefined on a pyramid refuse in one line."""
from __future__ import annotations

import pytest
import torch

import interp
from interp.errors import InterpError
from interp.models.planted import PlantedPvtTruth, planted_pvt, planted_truth
from interp.studies import open_source
from planted_pyramid_checks import PLANTED, check_ablation_against_random_controls, check_patch_file_on_plain_timm



@pytest.fixture(scope="module")
def planted():
    torch.manual_seed(0)
    model = interp.load("planted_pvt")
    return model, open_source(model=model, images=interp.models.sample_image_paths(), batch_size=4)


def truth_mask(model, source):
    truth = planted_truth(model)
    return torch.cat([truth.artifact_mask(model, x) for _, x in source.image_batches()])


def test_the_truth_names_stage_3(planted):
    model, source = planted
    truth = planted_truth(model)
    assert isinstance(truth, PlantedPvtTruth) and (truth.stage, truth.block, truth.layer) == (3, 0, 6)
    assert model.block_names.prefixes[truth.layer] == "stages.3.blocks.0"
    mask = truth_mask(model, source)
    assert mask.shape == (4, 7, 7) and 0 < int(mask.sum()) < mask.numel() // 4  # some flat regions, not most


def test_norms_finds_the_planted_tokens_at_the_planted_stage(planted):
    from interp.studies.artifacts.norms import norms_study

    model, source = planted
    result = norms_study(source, progress=False)
    assert result.artifacts_found and result.grid == [7, 7]
    found, energy = result.outlier_map_tensor(), torch.cat([planted_truth(model).texture_energy(model, x)
                                                           for _, x in source.image_batches()])
    tau = planted_truth(model).tau
    assert found[energy < tau / 4].all() and not found[energy > tau].any()  # clearly flat / clearly textured
    assert (found == truth_mask(model, source)).float().mean() >= 0.95
    assert result.blocks[6] == "stage 3 block 0"
    assert all(f == 0 for f in result.outlier_fraction_per_layer[:6]) and result.outlier_fraction_per_layer[6] > 0
    found = result.emergence_detected
    assert (found["layer"], found["component"]) == (6, "mlp") and found["separation"] >= 2


def test_neurons_ranks_the_planted_neurons_first(planted):
    from interp.studies.artifacts.neurons import neurons_study

    _, source = planted
    result = neurons_study(source, top_k=4, progress=False)
    assert result.artifacts_found and result.neuron_dict() == {6: PLANTED}
    assert result.lowest_layer == 6 and len(result.layer_max_score) == 8  # stage 3's blocks only are scored
    with pytest.raises(InterpError, match="another grid"):
        neurons_study(source, highest_layer=3, progress=False)


def test_ablating_the_planted_neurons_removes_the_artifacts_against_random_controls(planted):
    check_ablation_against_random_controls(planted[1])


def test_a_patch_file_reproduces_the_ablation_on_plain_timm(planted, tmp_path):
    check_patch_file_on_plain_timm(*planted, planted_pvt, tmp_path)


def test_without_the_plant_there_are_no_artifacts():
    from interp.studies.artifacts.norms import norms_study

    model = interp.load("pvt_v2_b0", pretrained=False)
    result = norms_study(open_source(model=model, images=interp.models.sample_image_paths(), batch_size=4),
                         progress=False)
    assert not result.artifacts_found


def test_studies_undefined_on_a_pyramid_refuse_in_one_line(planted):
    from interp.studies.artifacts.registers import registers_study
    from interp.studies.objects.lost import lost_study

    _, source = planted
    with pytest.raises(InterpError, match="test-time registers are not defined for .*PVTv2") as e:
        registers_study(source, neurons="6:17,6:101", progress=False)
    assert "\n" not in str(e.value)
    with pytest.raises(InterpError, match="LOST is not defined for the pyramid model planted_pvt") as e:
        lost_study(source, progress=False)
    assert "\n" not in str(e.value)


def test_redundancy_compares_each_token_on_the_detection_stages_grid(planted):
    """Neighbour similarity on stage 0's 56x56 grid, averaged over the cells each stage-3 token covers: the
    planted (flat) tokens' regions are more redundant than the others."""
    from interp.studies.artifacts.redundancy import pool_to_grid, redundancy_study

    e = torch.arange(2 * 16 * 3, dtype=torch.float32).reshape(2, 16, 3)
    pooled = pool_to_grid(e, (4, 4), (2, 2))
    torch.testing.assert_close(pooled[:, 0], e.reshape(2, 4, 4, 3)[:, :2, :2].mean((1, 2)))
    assert pool_to_grid(e, (4, 4), (4, 4)) is e
    _, source = planted
    result = redundancy_study(source, min_tokens=4, progress=False, warn=False)
    assert result.grid == [7, 7] and result.groups["normal"]["n_tokens"] + result.groups["high_norm"][
        "n_tokens"] == 4 * 49 and result.groups["high_norm"]["n_tokens"] > 0
    assert result.difference > 0.02

@pytest.mark.slow  # end to end: the whole report battery (~25 s on 2 busy cores)
def test_the_report_runs_on_the_planted_pvt_and_skips_what_a_pyramid_does_not_define(tmp_path):
    """The battery on a pyramid: no LOST and no test-time register (one line each), the plant recovered."""
    from interp.report import run_report

    model = interp.load("planted_pvt")
    summary = run_report(model, images=interp.models.sample_image_paths(), out_dir=tmp_path, progress=False,
                         n_controls=1)
    planted = summary["planted"]
    assert planted["layer_recovered"] and planted["all_neurons_recovered"]
    assert "PVTv2" in summary["synthetic_note"] and summary["lost"] is None
    assert "registers.json" not in summary["files"]["results"] and "ablate.json" in summary["files"]["results"]
    assert summary["stage_grids"] == [[56, 56], [28, 28], [14, 14], [7, 7]]
    assert "stage grids 56 x 56, 28 x 28, 14 x 14, 7 x 7, no prefix tokens" in (tmp_path / "index.html").read_text()
    page = (tmp_path / "index.html").read_text()
    assert 'id="lost"' in page and 'id="registers"' in page and "Not run: LOST is not defined" in page


def test_masking_masks_the_last_stages_cells_in_pixels(planted):
    """A stage-3 cell of PVTv2 covers 32 x 32 input pixels (224 / 7), not the 4-pixel embedding stride."""
    from interp.studies.aggregation.masking import masking_study

    _, source = planted
    result = masking_study(source, reference="pooled", fractions=(0.0, 0.5), orders=("random",), progress=False)
    assert result.patch_size == [32, 32]


def test_patch_score_records_the_cells_pixel_size(planted):
    from interp.studies.aggregation.patch_score import patch_score_study
    from interp.studies.core.regions import cell_size

    model, source = planted
    assert cell_size(source) == (32, 32) and tuple(source.patch_size) == (4, 4)
    result = patch_score_study(source, reference="pooled", progress=False)
    assert result.grid == [7, 7] and result.patch_size == [32, 32]


def test_the_histograms_title_gives_each_stages_token_count(planted):
    """The ridge plot's title said stage 0's count ("N patch tokens each") for every block (issue 52, item 3)."""
    from interp.plots.norms import norm_histograms
    from interp.studies.artifacts.norms import norms_study

    _, source = planted
    title = norm_histograms(norms_study(source, progress=False)).axes[0].get_title()
    n = len(source)
    assert title == f"every block ({n * 56 * 56} patch tokens in the first stage, down to {n * 7 * 7})"
