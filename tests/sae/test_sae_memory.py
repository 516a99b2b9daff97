"""Memory of the SAE line: the detection fitted on a bounded sample of images (``interp.sae.norm_cuts``) marks
what the detection on every image marks, and a run's data set-up and token stream, and the feature report over
a source, keep the peak RSS flat from 1x to 4x the images (no [N, P] norms, no [N, T] mask)."""
from __future__ import annotations

import numpy as np
import pytest

from interp.detection.thresholds import detect_norms
from interp.sae.norm_cuts import detection_sample, fit_detection
from memory_helpers import CLEAR_REFS, measured_in_a_fresh_process


def _norms(n: int, seed: int = 0) -> np.ndarray:
    """[n, 196] log-normal norms whose images differ in scale, 3 high-norm patches per image (x6)."""
    rng = np.random.default_rng(seed)
    norms = rng.lognormal(3.0, 0.2, (n, 196)) * rng.uniform(0.7, 1.4, (n, 1))
    norms[:, :3] *= 6
    return norms


@pytest.mark.parametrize("threshold", ["auto", "p99", 60.0])
def test_fitted_on_every_image_it_marks_what_detect_norms_marks(threshold):
    norms = _norms(50)
    found = fit_detection(norms, threshold, len(norms))
    reference = detect_norms(norms, threshold)
    assert found.artifacts_found == reference.artifacts_found
    assert np.array_equal(found.outliers(norms), reference.outliers)
    # read a few images at a time, in another order: each image is judged on its own norms
    order = np.random.default_rng(1).permutation(50)
    parts = np.concatenate([found.outliers(norms[order[i:i + 7]]) for i in range(0, 50, 7)])
    assert np.array_equal(parts, reference.outliers[order])


def test_a_sample_bounds_the_fit_and_still_finds_every_images_outliers():
    norms = _norms(300, seed=2)
    fitted = detection_sample(300, max_images=40)
    assert len(fitted) == 40 and np.array_equal(fitted, detection_sample(300, max_images=40))  # seeded
    assert np.array_equal(detection_sample(30, max_images=40), np.arange(30))  # all images below the cap
    found = fit_detection(norms[fitted], "auto", 300)
    assert found.n_fitted == 40 and found.to_dict()["fitted_on_images"] == 40
    outliers = found.outliers(norms)  # images never fitted on included
    assert outliers[:, :3].all() and not outliers[:, 3:].any()


@pytest.mark.skipif(not CLEAR_REFS.exists(), reason="needs Linux /proc to reset the peak RSS")
@pytest.mark.early("studies_memory")
def test_sae_data_memory_is_flat_from_1x_to_4x_images():
    import sae_memory

    measured = measured_in_a_fresh_process("studies_memory")["sae"]  # tests/memory_helpers.py
    for run in (measured["run_1x"], measured["run_4x"]):  # the runs worked: outliers found and left out
        assert run["artifacts_found"] and run["counts"] == [1024 - sae_memory.N_HIGH]
        assert run["tokens_streamed"] == sae_memory.SETTINGS["steps"] * sae_memory.SETTINGS["tokens_per_step"]
    patches = sae_memory.GRID[0] * sae_memory.GRID[1]
    # float64 norms of the 3x more images alone: 14.7 MB (the code before this measured +74 MB, 24.5 -> 98.3 MB)
    norms_added = 3 * sae_memory.IMAGES_1X * patches * 8
    growth = measured["4x"] - measured["1x"]
    assert growth < norms_added / 3, (f"peak RSS grew {growth / 1e6:.1f} MB from 1x to 4x images "
                                      f"({measured['1x'] / 1e6:.1f} -> {measured['4x'] / 1e6:.1f} MB)")
    # the feature report over a source (sae-features, ablate --sae): its peak holds batches of codes, so it
    # scatters more (-4 to +1 MB measured); the code before grew +49 and +52 MB (37 -> 86-89 MB)
    high = sae_memory.IMAGES_1X * sae_memory.N_HIGH_REPORT  # every planted patch found, none else
    assert measured["report_1x"] == {"artifacts_found": True, "high_norm": high}
    assert measured["report_4x"] == {"artifacts_found": True, "high_norm": 4 * high}
    growth = measured["features_4x"] - measured["features_1x"]
    assert growth < norms_added, (f"the feature report's peak RSS grew {growth / 1e6:.1f} MB from 1x to 4x images "
                                  f"({measured['features_1x'] / 1e6:.1f} -> {measured['features_4x'] / 1e6:.1f} MB)")
