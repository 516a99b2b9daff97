"""Emergence from the detected tokens (interp.studies.artifacts.emergence.find_detected_emergence): the first step
from which the detected tokens' norms stay separated from the other patches' (D >= 2, >= 2x) through the
detection block. Synthetic norms fed to the accumulator; one planted_vit run for the norms study's field."""
from __future__ import annotations

import numpy as np
import torch

import interp
from interp.studies import open_source
from interp.studies.artifacts.emergence import EmergenceAccumulator, find_detected_emergence, find_emergence, largest_step

N_LAYERS, N_IMAGES, P, K = 6, 8, 196, 3  # K detected tokens per image


def _stream(ratio: float, start: int, sigma: float = 0.3, seed: int = 0):
    """Curves of a stream whose bulk is log-normal (median 10, ``sigma``) at every step and whose K tokens per
    image sit at ``ratio`` x the median from block ``start``'s MLP step on (at 1x before)."""
    rng = np.random.default_rng(seed)
    detected = torch.zeros(N_IMAGES, P, dtype=torch.bool)
    detected[:, :K] = True
    acc = EmergenceAccumulator(N_LAYERS)
    for layer in range(N_LAYERS):
        for stage in ("resid_mid", "resid_post"):
            norms = 10 * np.exp(sigma * rng.standard_normal((N_IMAGES, P)))
            if layer > start or (layer == start and stage == "resid_post"):
                norms[:, :K] = ratio * 10 * np.exp(0.1 * rng.standard_normal((N_IMAGES, K)))
            acc.update(stage, layer, torch.tensor(norms, dtype=torch.float32), detected)
    return acc.finalize()


def test_a_3x_artifact_over_a_wide_bulk_is_found_where_the_max_norm_jump_finds_none():
    curves = _stream(3.0, start=3)
    assert find_emergence(curves, artifacts_found=True) is None  # max/median jumps by ~1.3 only
    found = find_detected_emergence(curves, N_LAYERS - 1, artifacts_found=True)
    assert found is not None and (found["layer"], found["component"]) == (3, "mlp")
    assert found["separation"] > 3 and 2.5 < found["ratio"] < 3.5  # criterion: D >= 2 and >= 2x
    before = found["steps"][2 * 3]  # block 3's attention step: not separated yet
    assert before[2] < 1 and before[3] < 1.3


def test_the_detection_block_bounds_the_search():
    curves = _stream(3.0, start=3)
    assert find_detected_emergence(curves, 2, artifacts_found=True) is None  # separated only after block 2
    assert len(find_detected_emergence(curves, 4, artifacts_found=True)["steps"]) == 2 * 5


def test_no_artifacts_or_no_separation_gives_none():
    assert find_detected_emergence(_stream(3.0, start=3), N_LAYERS - 1, artifacts_found=False) is None
    assert find_detected_emergence(_stream(1.0, start=3), N_LAYERS - 1, artifacts_found=True) is None
    assert find_detected_emergence(_stream(1.6, start=3), N_LAYERS - 1, artifacts_found=True) is None  # < 2x
    acc = EmergenceAccumulator(2)  # nothing detected: no groups measured
    for layer in range(2):
        for stage in ("resid_mid", "resid_post"):
            acc.update(stage, layer, torch.ones(2, 4))
    assert find_detected_emergence(acc.finalize(), 1, artifacts_found=True) is None


def test_the_norms_study_reports_it_on_planted_vit_and_round_trips():
    from interp.studies.artifacts.norms import NormsResult, norms_study

    torch.manual_seed(0)
    model = interp.load("planted_vit")
    result = norms_study(open_source(model=model, images=interp.models.sample_image_paths(), batch_size=4),
                         progress=False)
    found = result.emergence_detected
    assert result.artifacts_found and found is not None
    assert (found["layer"], found["component"]) == (2, "mlp")  # the planted block, like the max-norm jump
    assert found["separation"] >= 2 and found["ratio"] >= 2
    assert NormsResult.from_dict(result.to_dict()).emergence_detected["layer"] == 2


def test_the_largest_step_is_named_even_under_the_emergence_factor_and_without_artifacts():
    acc = EmergenceAccumulator(n_layers=2)
    flat, bump = torch.ones(1, 4), torch.tensor([[1.0, 1.0, 1.0, 1.5]])
    for layer, stage, norms in ((0, "resid_mid", flat), (0, "resid_post", flat), (1, "resid_mid", bump),
                                (1, "resid_post", bump)):
        acc.update(stage, layer, norms)
    curves = acc.finalize()
    assert find_emergence(curves, artifacts_found=True) is None  # 1.5x: under the factor 2
    as_saved = {"max_patch_norm": curves.max_patch_norm, "median_patch_norm": curves.median_patch_norm}
    step = largest_step(as_saved)
    assert (step["layer"], step["component"]) == (1, "attention") and abs(step["jump"] - 1.5) < 1e-6
