"""Studies that re-read the detection block count each image above its own cut, as the detection's outliers do
("auto" on [N, P] norms gives every image a cut scaled by its own bulk: ``Threshold.image_values``)."""
from __future__ import annotations

from dataclasses import replace

import interp
from interp.models import sample_image_paths
from interp.studies import detect, open_source
from interp.studies.artifacts.neurons import neurons_study
from interp.studies.artifacts.norms import norms_study
from interp.detection.spec import DetectionSpec
from interp.detection.detection import RunOptions


def _detection_with_one_image_above_everything():
    """planted_vit on the 4 photos, "auto" at the last block, then image 0's cut raised above every norm: the
    per-image cuts now differ from ``value``, which a study comparing with the one number would not see."""
    source = open_source(model=interp.load("planted_vit"), images=sample_image_paths())
    found = detect(source, DetectionSpec(threshold="auto"), RunOptions(progress=False))
    cuts = list(found.threshold.image_values)
    cuts[0] = float(found.norms[0].max()) * 10
    found = replace(found, threshold=replace(found.threshold, image_values=tuple(cuts)))
    assert int(found.outliers[0].sum()) == 0 and int(found.outliers[1:].sum()) > 0
    return source, found


def test_norms_and_neurons_count_the_detections_own_outliers():
    source, found = _detection_with_one_image_above_everything()
    expected = int(found.outliers.sum())
    norms = norms_study(source, detection=found, progress=False)
    n_patches = found.norms.numel()
    assert round(norms.outlier_fraction_per_layer[found.layer] * n_patches) == expected
    neurons = neurons_study(source, detection=found, positions="patches", progress=False)
    assert neurons.n_outlier_tokens == expected
    assert source.ids[0] not in neurons.image_ids  # image 0 has no outlier under its own cut
