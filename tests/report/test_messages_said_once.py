"""Messages a newcomer reads (issue 52, item 10): the synthetic-model note says what the model is once, an
ablation that adds outliers does not "remove -100 %" of them, and ``print(detection)`` is a line, not a dump."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from interp.models.planted import PlantedPvtTruth, PlantedTruth
from interp.report.summary import SYNTHETIC_NOTE, synthetic_note_for
from interp.studies.artifacts.ablate import outlier_change
from interp.detection.detection import RunOptions

DINOV3 = ("synthetic DINOv3-architecture model (timm Eva) with planted register neurons (random weights; not a "
          "trained model)")


def _default(cls, field):
    return next(f.default for f in dataclasses.fields(cls) if f.name == field)


@pytest.mark.parametrize("description", [_default(PlantedTruth, "description"),
                                         _default(PlantedPvtTruth, "description"), DINOV3])
def test_the_synthetic_note_names_the_architecture_once(description):
    note = synthetic_note_for(description)
    assert note.count("synthetic") == 1 and note.count("random weights") == 1 and note.count("planted") == 2
    assert note.startswith("This is a synthetic planted ") and "((" not in note and "))" not in note
    assert synthetic_note_for(None) == SYNTHETIC_NOTE


def test_an_edit_that_adds_outliers_says_so():
    assert outlier_change(-1.0) == "adds 100% more outliers" and "-" not in outlier_change(-0.5)
    assert outlier_change(0.0) == "removes 0% of the outliers"


def test_a_detection_prints_as_one_short_line():
    import interp
    from interp.models import sample_image_paths
    from interp.studies import detect, open_source

    source = open_source(interp.load("planted_vit"), images=sample_image_paths())
    text = repr(detect(source, options=RunOptions(progress=False)))
    assert "\n" not in text and len(text) < 200 and "tensor" not in text
    assert text.startswith("Detection(layer=5,") and "images=4" in text and "outliers=" in text


def test_a_redundancy_difference_below_what_the_measure_resolves_is_not_a_finding():
    """planted_dinov3's page called high-norm patches "more redundant" from medians 0.99986 vs 0.9999979, where
    reassess says n/a (normal patches already parallel to their neighbours): the page now says n/a too."""
    from interp.report.html import PLANTED_PROBES_CAVEAT, _redundancy_sentences

    group = {"mean": 0.99, "n_tokens": 100, "note": None}
    red = {"hook": "hook_embed", "normal": dict(group, median=0.99986), "high_norm": dict(group, median=0.9999979)}
    text = " ".join(_redundancy_sentences(red))
    assert "n/a" in text and "more redundant than" not in text
    contrast = dict(red, normal=dict(group, median=0.6))
    assert "are more redundant than the normal ones" in " ".join(_redundancy_sentences(contrast))
    assert "high position" not in PLANTED_PROBES_CAVEAT  # the scores beside it may be at chance


def test_the_redundancy_legend_tells_medians_near_1_apart():
    """The figure's legend printed medians 0.99986 and 0.9999979 both as "1.00"."""
    from interp.plots.redundancy import neighbour_similarity
    from interp.studies.artifacts.redundancy import RedundancyResult

    group = {"n_tokens": 10, "mean": 0.99, "histogram": [0] * 19 + [10]}
    result = RedundancyResult(model="m", fingerprint="", params={}, seed=0, hist_edges=list(np.linspace(-1, 1, 21)),
                              groups={"normal": dict(group, median=0.99986), "high_norm": dict(group, median=0.9999979)})
    legend = [t.get_text() for t in neighbour_similarity(result).axes[0].get_legend().get_texts()]
    assert any("median 0.99986" in t for t in legend) and any("median 0.9999979" in t for t in legend), legend
