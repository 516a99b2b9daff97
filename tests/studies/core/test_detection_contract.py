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


# What may take or hold a parameter/field named threshold, detect_layer or preset in the engines, each with why.
DISPLAY_THRESHOLD = {  # the explorer's per-request display threshold: the page's slider, not the detection
    "interp.explore.Explorer.run", "interp.explore.session.ExploreSession.run",
    "interp.explore.requests.check_threshold"}
RESOLVED_VALUES = {  # handed a value a Detection already resolved (a norm cut, a block index): they take no spec
    "interp.sae.norm_cuts.SampledDetection", "interp.sae.norm_cuts.fit_detection",
    "interp.studies.artifacts.emergence.find_detected_emergence",
    "interp.studies.artifacts.neurons.score_register_neurons",
    "interp.studies.artifacts.register_scores.RegisterScoreAccumulator.outlier_mask",
    "interp.studies.artifacts.register_scores.RegisterScoreAccumulator.update",
    "interp.studies.causal.patching.sweep_result",
    "interp.studies.causal.sweep.MetricSpec",
    "interp.studies.causal.sweep.metric_spec", "interp.studies.repairs.calibration.block_thresholds"}
PRESET_SETTINGS = {  # a preset's settings beside the detection (the neurons study's positions, sparsity, top_k)
    "interp.studies.artifacts.neurons.resolve_neuron_options"}


def _engine_modules():
    import importlib
    import pkgutil

    for name in ("interp.report", "interp.explore", "interp.sae", "interp.studies"):
        package = importlib.import_module(name)
        yield package
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            yield importlib.import_module(info.name)


def _loose_detection_names():
    """{qualified name: the loose names it takes or holds} over the public functions, classes and methods of
    interp/report, interp/explore, interp/sae and interp/studies, leaving out the spec itself (DetectionSpec and its
    groups) and results (a result records the resolved detection header; it takes none)."""
    import dataclasses
    import inspect

    from interp.studies.core.result import StudyResult

    loose, found = {"threshold", "detect_layer", "preset"}, {}

    def names(f):
        return set(inspect.signature(f).parameters) & loose

    for module in _engine_modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            where = f"{module.__name__}.{name}"
            if inspect.isfunction(obj) and names(obj):
                found[where] = names(obj)
            if not inspect.isclass(obj) or issubclass(obj, (DetectionSpec, StudyResult)):
                continue
            if dataclasses.is_dataclass(obj) and loose & {f.name for f in dataclasses.fields(obj)}:
                found[where] = loose & {f.name for f in dataclasses.fields(obj)}
            for method_name, method in vars(obj).items():
                if not method_name.startswith("_") and inspect.isfunction(method) and names(method):
                    found[f"{where}.{method_name}"] = names(method)
    return found


def test_no_engine_takes_a_loose_detection_field():
    """Issue 48: one way into detection. The report, the explorer, the SAE features and every study take
    detection= (a DetectionSpec, or a Detection where a study takes one); none takes or holds threshold,
    detect_layer or preset of its own, but the named exceptions (each a different concept) above."""
    import inspect

    from interp.explore import start
    from interp.report import ReportOptions
    from interp.report.compare import CompareSettings
    from interp.explore.session import ExploreOptions
    from interp.sae.features import sae_features, source_feature_report

    found = _loose_detection_names()
    allowed = DISPLAY_THRESHOLD | RESOLVED_VALUES | PRESET_SETTINGS
    assert set(found) - allowed == set(), {k: found[k] for k in set(found) - allowed}
    assert allowed - set(found) == set()  # an exception that no longer exists leaves the list
    for options in (ReportOptions, ExploreOptions, CompareSettings):
        assert options().detection == DetectionSpec(), options
    for engine in (start, sae_features, source_feature_report):
        assert inspect.signature(engine).parameters["detection"].default == DetectionSpec(), engine


@pytest.mark.parametrize("name", ["threshold", "detect_layer", "preset"])
def test_the_engines_refuse_loose_detection_keywords_in_one_line(name, tmp_path):
    """Refused before any model is built: the message names the spec to write."""
    from interp.explore import start
    from interp.report import run_report

    for run in (lambda: run_report(None, out_dir=tmp_path, **{name: 1}),
                lambda: start(None, **{name: 1})):
        with pytest.raises(InterpError, match=rf"^\S+: {name}= belongs to the detection; pass "
                                              rf"detection=DetectionSpec\({name}=\.\.\.\) or a Detection made "
                                              r"by detect\(\)$"):
            run()
    assert not any(tmp_path.iterdir())  # nothing written
