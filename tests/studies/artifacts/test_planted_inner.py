"""Artifacts where the code does not look first: a PVTv2 and a Swin-v2 planted in stage 2 (block 4 of 8, whose
stage-3 patch embedding / merging normalises the tokens again: the last block has none) and a plain ViT planted at
block 2 whose block 4 washes them out. With no detection block given, detection judges every block and detects
where the artifacts are; ``norms``, ``neurons`` and ``ablate`` then find the planted tokens and neurons."""
from __future__ import annotations

import re

import pytest
import torch

import interp
from interp.detection.detection import detect
from interp.models.planted import planted_truth
from interp.studies import open_source
from interp.studies.artifacts.ablate import ablate_study
from interp.studies.artifacts.neurons import neurons_study
from interp.studies.artifacts.norms import norms_study
from interp.detection.spec import DetectionSpec
from interp.detection.detection import RunOptions

NEURONS = (17, 101, 402, 500)  # stage 2 of the pyramids has 512 (Swin) / 640 (PVTv2) MLP neurons
CASES = {  # name -> (load arguments, planted block, detection block, what the survey says)
    "pvt_stage2": ("planted_pvt", dict(stage=2, block=0, neurons=NEURONS), 4, 5,
                   r"stage 1: none; stage 2: artifacts, \d\.\d\dx, blocks 4-5; stage 3: none"),
    "swin_stage2": ("planted_swin", dict(stage=2, block=0, neurons=NEURONS), 4, 5,
                    r"stage 1: none; stage 2: artifacts, \d\.\d\dx, blocks 4-5; stage 3: none"),
    "vit_washed": ("planted_vit", dict(layer=2, wash=4, neurons=NEURONS), 2, 3,
                   r"^artifacts at blocks 2-3 \(up to \d\.\d\dx\), none at the last block$"),
}


@pytest.fixture(scope="module", params=list(CASES))
def planted(request):
    name, kwargs, layer, chosen, summary = CASES[request.param]
    model = interp.load(name, **kwargs)
    source = open_source(model=model, images=interp.models.sample_image_paths(), batch_size=4)
    return model, source, detect(source, options=RunOptions(progress=False)), (layer, chosen, summary)


def test_the_detection_block_is_where_the_artifacts_are(planted):
    model, source, det, (layer, chosen, summary) = planted
    assert planted_truth(model).layer == layer
    assert det.layer == chosen and det.artifacts_found and not det.from_input.any()
    assert det.survey is not None and not det.survey.blocks[-1].found  # the last block shows none
    last = detect(source, DetectionSpec(detect_layer=-1), RunOptions(progress=False))  # what detection at the last block says
    assert not last.artifacts_found
    truth = torch.cat([planted_truth(model).artifact_mask(model, x) for _, x in source.image_batches()])
    assert (det.outliers.reshape(truth.shape) == truth).float().mean() >= 0.95
    result = norms_study(source, detection=det, progress=False)
    assert result.artifacts_found and result.grid == list(truth.shape[1:])
    assert result.artifact_blocks is not None
    assert re.search(summary, result.artifact_blocks), result.artifact_blocks
    emerged = result.emergence_detected
    assert (emerged["layer"], emerged["component"]) == (layer, "mlp")


def test_neurons_and_ablation_follow_the_detection(planted):
    _, source, det, (layer, chosen, _) = planted
    ranked = neurons_study(source, detection=det, top_k=4, progress=False)
    assert ranked.artifacts_found and ranked.neuron_dict() == {layer: list(NEURONS)}
    result = ablate_study(source, detection=det, neurons=ranked, controls=1, progress=False)
    counts = result.summary["outlier_count"]
    assert result.detect_layer == chosen
    assert counts["baseline"] > 0 and counts["target"] == 0 and counts["control_mean"] == counts["baseline"]
