"""Masking and selective-CLS run every forward under the source's own interventions (issue 15: interventions
are explicit, never ambient): a source that ablates planted_vit's register neurons has no outliers in them."""
from __future__ import annotations

import pytest

from interp.interventions import NeuronAblation
from interp.models.planted import planted_truth
from interp.models.inputs.samples import SAMPLES_DIR
from interp.studies.aggregation.masking import masking_study
from interp.studies.aggregation.selective_cls import selective_cls_study
from interp.runtime.open import open_source
from interp.detection.spec import DetectionSpec


@pytest.fixture(scope="module")
def sources():
    import interp

    model = interp.load("planted_vit")
    truth = planted_truth(model)
    ablate = NeuronAblation({truth.layer: list(truth.neurons)})
    return (open_source(model=model, images=str(SAMPLES_DIR)),
            open_source(model=model, images=str(SAMPLES_DIR), interventions=[ablate]))


def test_masking_counts_outliers_under_the_source_interventions(sources):
    plain, ablated = sources
    kw = dict(detection=DetectionSpec(threshold=300.0), fractions=[0, 0.5], orders=("top",), progress=False)
    before = masking_study(plain, **kw)
    after = masking_study(ablated, **kw)
    assert before.unmasked["outliers_per_image"] > 10       # planted_vit writes ~36 artifacts per image
    assert after.unmasked["outliers_per_image"] == 0        # its register neurons are zeroed in every forward
    assert after.curves["top"]["outliers_per_image"] == [0.0, 0.0]


def test_selective_cls_rows_run_under_the_source_interventions(sources):
    plain, ablated = sources
    kw = dict(ks=[1], progress=False, n_boot=10)
    before = selective_cls_study(plain, **kw).conditions["k=1"]["pooled_cosine"]
    after = selective_cls_study(ablated, **kw).conditions["k=1"]["pooled_cosine"]
    # SelectiveCLS(1) moves planted_vit's pooled vector (cosine ~0.71 to the baseline) because it picks the
    # artifact tokens; with the register neurons ablated in every forward there are none to pick (~1.0)
    assert before < 0.9 and after > 0.99
