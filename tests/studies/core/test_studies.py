"""Artifact studies (norms, neurons, ablate, relocate, registers) against the planted ground truth, on
models without artifacts, live vs cached, and with bounded memory over a large cache."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import interp
import interp.cache
from interp.models import planted_truth, sample_image_paths
from interp.studies import CacheSource, open_source
from interp.studies.artifacts.ablate import ablate_study
from interp.studies.artifacts.neurons import neurons_study
from interp.studies.artifacts.norms import norms_study
from interp.studies.artifacts.registers import registers_study
from interp.studies.core.stats import iou
from interp.studies.artifacts.relocate import relocate_study

from conftest import images, make_model
from memory_helpers import CLEAR_REFS, LazyReader, measured_in_a_fresh_process
from interp.detection.spec import DetectionSpec
from interp.detection.detection import RunOptions


def constructed_images() -> torch.Tensor:
    """Gaussian-noise images (textured everywhere) with flat squares at known places (patch size 16)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 224, 224, generator=g)
    x[0, :, :64, :64] = 0.4                                   # 4x4 patches, top left
    x[1, :, 96:160, 32:224] = -0.3                            # 4x12 band
    x[2, :, 160:224, 160:224] = 0.2                           # 4x4 bottom right ...
    x[2, :, 0:32, 96:128] = -0.1                              # ... and 2x2 at the top
    x[3, :, 32:96, 112:208] = 0.0                             # 4x6
    return x


@pytest.fixture(scope="module")
def planted():
    return interp.load("planted_vit")


@pytest.fixture(scope="module")
def pixels():
    return constructed_images()


@pytest.fixture(scope="module")
def source(planted, pixels):
    return open_source(model=planted, images=pixels, batch_size=3)  # 3: a batch boundary inside the set


@pytest.fixture(scope="module")
def norms(source):
    return norms_study(source, progress=False)


@pytest.fixture(scope="module")
def planted_neurons(planted):
    truth = planted_truth(planted)
    return {truth.layer: list(truth.neurons)}


def test_norms_study_finds_the_planted_outliers_and_their_emergence(planted, pixels, norms):
    truth = planted_truth(planted)
    expected = truth.artifact_mask(planted.timm_model, pixels)
    assert int(expected.sum()) == 16 + 48 + 20 + 24  # the squares above, all patch-aligned
    found = norms.outlier_map_tensor()
    assert norms.artifacts_found and norms.bimodal and norms.threshold is not None
    assert norms.detect_layer == planted.n_layers - 1
    assert iou(found, expected) >= 0.9
    assert all(iou(f, e) >= 0.9 for f, e in zip(found, expected))
    assert norms.outlier_counts == [int(m.sum()) for m in found]
    assert norms.emergence["layer"] == truth.layer and norms.emergence["component"] == "mlp"
    # outliers exist from the planted block's output on, and not before it
    fractions = norms.outlier_fraction_per_layer
    assert all(f == 0 for f in fractions[:truth.layer]) and all(f > 0 for f in fractions[truth.layer:])
    # the planted attention sinks start one block after the planted MLP
    attn = norms.cls_attention_max
    assert min(attn[truth.layer + 1:]) > 10 * max(attn[:truth.layer + 1])


@pytest.mark.parametrize("highest", ["planted", "default"])
def test_neurons_study_ranks_the_planted_neurons_first(planted, source, highest):
    truth = planted_truth(planted)
    k = len(truth.neurons)
    kwargs = {"highest_layer": truth.layer} if highest == "planted" else {}  # default: the detection block
    result = neurons_study(source, top_k=k + 2, progress=False, **kwargs)
    top = {(e["layer"], e["neuron"]) for e in result.neurons[:k]}
    assert top == {(truth.layer, n) for n in truth.neurons}
    scores = [e["score"] for e in result.neurons]
    assert min(scores[:k]) > 3 * max(scores[k:])  # well separated from the next neurons
    assert result.n_images_with_outliers == len(source)
    assert int(np.argmax(result.layer_max_score)) == truth.layer
    assert set(result.neuron_dict()[truth.layer]) >= set(truth.neurons)


def test_ablating_the_planted_neurons_removes_the_outliers_but_random_controls_do_not(source, planted_neurons, norms):
    result = ablate_study(source, neurons=planted_neurons, controls=3, seed=0, progress=False)
    counts = result.summary["outlier_count"]
    assert counts["baseline"] == sum(norms.outlier_counts) > 0
    assert counts["target"] == 0
    controls = [result.conditions[f"control_{i}"]["outlier_count"] for i in range(3)]
    assert all(c >= 0.9 * counts["baseline"] for c in controls)
    assert result.conditions["target"]["max_norm"] < result.threshold < result.conditions["control_0"]["max_norm"]
    # the controls are random same-size sets from the same block, without the targets
    for ctrl in result.controls:
        layer, = ctrl.keys()
        assert int(layer) == next(iter(planted_neurons)) and len(ctrl[layer]) == len(planted_neurons[int(layer)])
        assert not set(ctrl[layer]) & set(planted_neurons[int(layer)])


def test_relocation_puts_the_outliers_on_the_smiley(planted, source, planted_neurons):
    from interp.interventions import masks

    result = relocate_study(source, neurons=planted_neurons, progress=False)
    smiley = masks.smiley(planted.layout.grid)
    assert result.target == smiley.int().tolist()
    assert all(any(any(row) for row in m) for m in result.outlier_maps_before)  # every image had outliers
    assert result.mean_iou >= 0.9 and min(result.iou) >= 0.9
    assert result.cls_attention_argmax_on_target == 1.0


def test_test_time_register_takes_the_high_norm_off_the_patches(source, planted_neurons, norms):
    result = registers_study(source, neurons=planted_neurons, progress=False)
    assert result.baseline["outlier_count"] == sum(norms.outlier_counts) > 0
    assert result.with_register["outlier_count"] == 0
    assert result.with_register["max_patch_norm"] < result.threshold
    assert len(result.register_norm) == len(source)
    assert min(result.register_norm) > result.with_register["max_patch_norm"]
    assert min(result.register_norm) > result.threshold
    assert all(not any(any(row) for row in m) for m in result.outlier_maps_after)


@pytest.mark.parametrize("family", ["vit", "dinov2_reg", "clip"])
def test_random_init_models_have_no_artifacts(family):
    model = make_model(family)
    src = open_source(model=model, images=images(2))
    norms = norms_study(src, progress=False)
    assert norms.artifacts_found is False and norms.threshold is None
    assert norms.outlier_fraction == 0 and norms.emergence is None
    assert len(norms.max_patch_norm["resid_post"]) == model.n_layers  # it did measure every block
    neurons = neurons_study(src, progress=False)
    assert neurons.neurons == [] and neurons.neuron_dict() == {}
    assert "no outliers" in neurons.message


# ----------------------------------------------------------------------------------------- live vs cache
def assert_close_json(a, b, path="result", rel=1e-4, abs_=1e-5):
    """Equal JSON-like values, floats up to a tolerance."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {set(a) ^ set(b)} differ"
        for k in a:
            assert_close_json(a[k], b[k], f"{path}.{k}", rel, abs_)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_json(x, y, f"{path}[{i}]", rel, abs_)
    elif isinstance(a, float) and not isinstance(b, bool) and isinstance(b, (int, float)):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=abs_), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_live_and_cached_runs_give_the_same_results(planted, tmp_path):
    paths = [p for p in sample_image_paths() if p.stem in ("astronaut", "chelsea", "rocket")]  # chelsea: none
    hooks = ["blocks.*.hook_resid_mid", "blocks.*.hook_resid_post", "blocks.*.mlp.hook_post",
             "blocks.*.attn.hook_pattern"]
    cache_file = tmp_path / "planted.h5"
    interp.cache.write(planted, paths, hooks=hooks, path=cache_file, dtype="float32", batch_size=2, progress=False)
    cached = open_source(cache=cache_file, model=planted)
    live = open_source(model=planted, images=paths)
    assert isinstance(cached, CacheSource) and cached.ids == live.ids

    norms_cached, norms_live = norms_study(cached, progress=False), norms_study(live, progress=False)
    assert norms_live.artifacts_found and norms_live.cls_attention_max is not None  # a comparison worth making
    assert_close_json(norms_cached.to_dict(), norms_live.to_dict())

    neurons_cached = neurons_study(cached, top_k=6, progress=False)
    neurons_live = neurons_study(live, top_k=6, progress=False)
    assert len(neurons_live.neurons) == 6
    assert_close_json(neurons_cached.to_dict(), neurons_live.to_dict())


# ----------------------------------------------------------------------------------------- memory
@pytest.mark.skipif(not CLEAR_REFS.exists(), reason="needs Linux /proc to reset the peak RSS")
@pytest.mark.early("studies_memory")
def test_norms_study_memory_stays_bounded_over_a_1000_image_cache():
    reader = LazyReader(1000)
    one_hook_bytes = 1000 * reader.layout.n_tokens * reader.d_model * 4  # ~50 MB; the 4 hooks read: ~200 MB
    measured = measured_in_a_fresh_process("studies_memory")["norms"]
    # The instrument sees a whole-dataset read of a single hook ...
    assert measured["whole_hook"] >= 0.9 * one_hook_bytes
    # ... and the study, which reads every hook of all 1000 images, stays below half of it: its results hold
    # a few numbers per token and hook (~13 MB here, at d_model 64), while holding any one hook would take 50 MB.
    assert measured["artifacts_found"] and measured["outlier_counts"] == [reader.n_outliers] * 1000
    assert measured["study"] < one_hook_bytes / 2, f"norms_study grew the peak RSS by {measured['study'] / 1e6:.1f} MB"


# ----------------------------------------------------------------------------------------- one detection
def counting_source(source):
    """``source`` with a counter of the images it feeds the model (``batches`` reads through ``image_batches``)."""
    seen = {"images": 0}
    image_batches = source.image_batches

    def counted_image_batches(*args, **kwargs):
        for start, x in image_batches(*args, **kwargs):
            seen["images"] += len(x)
            yield start, x

    source.image_batches = counted_image_batches
    return seen


def test_a_shared_detection_gives_the_same_results_with_one_pass_less(planted, pixels, planted_neurons):
    from interp.detection.detection import detect

    own = open_source(model=planted, images=pixels, batch_size=3)
    shared = open_source(model=planted, images=pixels, batch_size=3)
    found = detect(shared, DetectionSpec(threshold="auto"), RunOptions(progress=False))
    assert found.outliers.shape == (4, 196) and found.artifacts_found and found.layer == planted.n_layers - 1
    runs = [
        lambda src, **kw: norms_study(src, progress=False, **kw),
        lambda src, **kw: neurons_study(src, top_k=6, progress=False, **kw),
        lambda src, **kw: ablate_study(src, neurons=planted_neurons, controls=1, progress=False, **kw),
        lambda src, **kw: registers_study(src, neurons=planted_neurons, progress=False, **kw),
    ]
    for run in runs:
        seen_own, seen_shared = counting_source(own), counting_source(shared)
        alone, given = run(own), run(shared, detection=found)
        assert json.dumps(alone.to_dict(), sort_keys=True) == json.dumps(given.to_dict(), sort_keys=True)
        assert seen_own["images"] - seen_shared["images"] == len(pixels)  # the detection pass, saved
        del own.image_batches, shared.image_batches


def test_a_detection_must_match_the_source_and_is_given_once(planted, pixels, source):
    from interp.errors import InterpError
    from interp.detection.detection import detect
    from interp.studies.artifacts.configs import NeuronsConfig

    found = detect(source, DetectionSpec(detect_layer=-1, threshold="p90"), RunOptions(progress=False))
    with pytest.raises(InterpError, match="give the detection once"):
        neurons_study(source, NeuronsConfig(detection=DetectionSpec(threshold="auto")), detection=found,
                      progress=False)
    with pytest.raises(InterpError, match="detect_layer= belongs to the detection"):
        norms_study(source, detect_layer=1, progress=False)
    other = open_source(model=planted, images=pixels[:2])
    with pytest.raises(InterpError, match="other images or weights"):
        norms_study(other, detection=found, progress=False)
    # the Detection's spec and layer are recorded
    assert norms_study(source, detection=found, progress=False).params["threshold"] == "p90"
