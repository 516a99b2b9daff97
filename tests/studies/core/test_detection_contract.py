"""One detection contract: a DetectionSpec resolved once into a Detection, one result header for every study
built on high-norm tokens, relocation counted with the unedited model's detection, from_dict checks the study."""
import json

import pytest

import interp
from interp.errors import InterpError
from interp.models.planted import planted_truth
from interp.models.inputs.samples import sample_image_paths
from interp.studies import open_source
from interp.studies.artifacts.ablate import ablate_study
from interp.detection.detection import RunOptions, threshold_param
from interp.detection.spec import DetectionSpec
from interp.studies.artifacts.configs import NormsConfig
from interp.studies.artifacts.neurons import NeuronsResult, neurons_study
from interp.studies.artifacts.norms import NormsResult, norms_study
from interp.detection.detection import detect
from interp.studies.artifacts.registers import registers_study
from interp.studies.artifacts.relocate import relocate_study

HEADER = ("detect_layer", "threshold", "threshold_method", "artifacts_found", "warning", "preset")


@pytest.fixture(scope="module")
def planted():
    model = interp.load("planted_vit")
    truth = planted_truth(model)
    source = open_source(model=model, images=sample_image_paths()).held()
    return source, {truth.layer: list(truth.neurons)}


def test_every_outlier_study_takes_a_spec_or_a_detection_and_carries_one_header(planted, one_thread):
    source, neurons = planted
    spec = DetectionSpec(preset="darcet")  # threshold 150 at the last block
    found = detect(source, spec, RunOptions(progress=False))
    assert found.preset == "darcet" and found.layer == source.n_layers - 1
    runs = {
        "norms": lambda d: norms_study(source, detection=d, progress=False),
        "neurons": lambda d: neurons_study(source, detection=d, progress=False),
        "ablate": lambda d: ablate_study(source, neurons=neurons, controls=1, detection=d, progress=False),
        "registers": lambda d: registers_study(source, neurons=neurons, detection=d, progress=False),
        "relocate": lambda d: relocate_study(source, neurons=neurons, detection=d, progress=False),
    }
    expected = {"detect_layer": found.layer, "threshold": 150.0, "threshold_method": "fixed", "preset": "darcet",
                "artifacts_found": found.artifacts_found}
    for name, run in runs.items():
        for given in (spec, found):
            result = run(given)
            header = {k: getattr(result, k) for k in HEADER}
            assert {k: header[k] for k in expected} == expected, (name, header)
            assert (result.params["threshold"], result.params["preset"]) == (150.0, "darcet"), name
            assert result.ids == source.ids, name


def test_relocation_counts_with_the_unedited_models_threshold(planted, one_thread):
    """Before, relocation fitted its threshold on the before and after norms together."""
    source, neurons = planted
    result = relocate_study(source, detection=DetectionSpec(threshold="p98"), neurons=neurons, progress=False)
    own = detect(source, DetectionSpec(threshold="p98"), RunOptions(progress=False))
    assert result.threshold == pytest.approx(own.threshold.value)
    assert result.counting_threshold == pytest.approx(own.threshold.value)
    assert result.params["threshold"] == "p98" and result.threshold_method == "percentile"
    before = own.norms > own.threshold.value
    assert result.outlier_maps_before == before.reshape(-1, *source.layout.grid).int().tolist()


def test_one_detection_function_and_one_detection_keyword():
    """interp.detection.detection makes a Detection one way (detect); every study whose config holds the
    detection group (a DetectionSpec field, its flags --threshold/--preset/--detect-layer) takes detection=, the
    others take none, and no study or config takes threshold/detect_layer/preset of its own."""
    import dataclasses
    import inspect

    import interp.detection.detection as module
    from interp.detection.detection import Detection
    from interp.studies.catalog import declared, study_function

    made = [name for name, f in vars(module).items() if inspect.isfunction(f) and f.__module__ == module.__name__
            and not name.startswith("_") and inspect.signature(f).return_annotation in ("Detection", Detection)]
    assert made == ["detect"]
    assert not {"as_detection", "spec_of", "detect_spec", "detect_with_baseline", "detection_from_norms"} & set(vars(module))
    loose = {"threshold", "detect_layer", "preset"}
    detecting = []
    for name, config in declared().items():
        fields = {f.name: f for f in dataclasses.fields(config)}
        assert not loose & set(fields), name
        function = inspect.unwrap(study_function(config))
        takes = set(inspect.signature(function).parameters)
        assert not loose & takes, name
        if "detection" in fields:
            assert issubclass(fields["detection"].metadata["group"], DetectionSpec), name
            assert "detection" in takes, name
            detecting.append(name)
        else:
            assert "detection" not in takes, name
    assert {"norms", "neurons", "redundancy", "ablate", "relocate", "registers", "replace", "masking", "probes",
            "patching", "attribution", "sae-features"} <= set(detecting)


def test_threshold_params_have_one_form():
    assert [threshold_param(v) for v in (150, "150", " P98 ", "auto", None)] == [150.0, 150.0, "p98", "auto", None]
    with pytest.raises(InterpError):
        DetectionSpec(threshold="p200").resolved()


def test_the_detection_is_said_once(planted):
    """One keyword: loose threshold/detect_layer/preset keywords are refused with the spec to write, and a
    Detection handed to a study whose config holds a spec of its own too is refused."""
    source, _ = planted
    with pytest.raises(InterpError, match=r"threshold= belongs to the detection; pass detection=DetectionSpec"):
        norms_study(source, threshold="p98", progress=False)
    found = detect(source, DetectionSpec(threshold="auto"), RunOptions(progress=False))
    with pytest.raises(InterpError, match="give the detection once"):
        norms_study(source, NormsConfig(detection=DetectionSpec(preset="darcet")), detection=found, progress=False)
    with pytest.raises(InterpError, match="other images or weights"):
        norms_study(open_source(model=source.model, images=sample_image_paths()[:2]), detection=found, progress=False)


def test_from_dict_refuses_another_studys_result(planted, tmp_path):
    source, _ = planted
    norms = norms_study(source, progress=False)
    path = tmp_path / "norms.json"
    norms.to_json(path)
    assert NormsResult.from_json(path).threshold == norms.threshold
    with pytest.raises(InterpError, match="'norms' result, not a 'neurons'"):
        NeuronsResult.from_json(path)
    assert json.loads(path.read_text())["ids"] == source.ids


def test_run_options_hold_only_what_a_pass_reads(planted, one_thread):
    """RunOptions has no dead field: batch size and progress bars, both read by a detection pass (device and seed
    were fields nothing read: a study runs where its model is, and each study takes its own seed=)."""
    import dataclasses

    source, _ = planted
    assert [f.name for f in dataclasses.fields(RunOptions)] == ["batch_size", "progress"]
    sizes = []
    hook = source.model.timm_model.patch_embed.register_forward_pre_hook(lambda m, inp: sizes.append(len(inp[0])))
    try:
        one = detect(source, DetectionSpec(), RunOptions(batch_size=1, progress=False))
        assert sizes == [1] * len(source)
        sizes.clear()
        assert detect(source, DetectionSpec(), RunOptions(batch_size=3, progress=False)).threshold == one.threshold
        assert sizes == [3, len(source) - 3]
    finally:
        hook.remove()
