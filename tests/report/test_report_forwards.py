"""The report shares its forwards: one unedited pass per image serves the detection and the causal studies'
baselines, and one observational pass serves norms, neuron scores, probes and LOST, so ``interp report`` runs
10 forwards per image on its defaults (it ran 16, then 13)."""
import json
import warnings

import pytest

import interp
from interp.models.planted import planted_truth
from interp.models.inputs.samples import sample_image_paths
from interp.studies import open_source
from interp.studies.artifacts.ablate import ablate_study
from interp.runtime.passes import baseline_pass
from interp.detection.detection import detect
from interp.studies.artifacts.registers import registers_study
from interp.studies.artifacts.relocate import relocate_study
from interp.detection.spec import DetectionSpec
from interp.detection.detection import RunOptions


def _count_image_forwards(model) -> list:
    seen = [0]
    model.timm_model.patch_embed.register_forward_pre_hook(lambda module, inp: seen.__setitem__(0, seen[0] + len(inp[0])))
    return seen


def test_the_report_runs_23_forwards_per_image(default_report):
    # baseline 1 (detection + causal baselines), observational 1 (norms, neurons, probes, LOST, redundancy),
    # ablation 1 target + 5 controls for each of 3 replacements (zero, mean, resample) and 1 pass for the means of
    # all 6 neuron sets, test-time register 1, relocation 1: counted on the default report's run (conftest.py),
    # whose images all load
    assert default_report.rc == 0 and default_report.report["skipped_images"] == []
    assert default_report.image_forwards / default_report.report["n_images"] == 1 + 1 + 3 * 6 + 1 + 1 + 1
    # one way to save: every study JSON of the report lists its figures and its skipped images
    for name in ("norms", "neurons", "ablate", "registers", "relocate", "probes", "lost", "redundancy"):
        data = json.loads((default_report.out / f"{name}.json").read_text())
        assert data["skipped"] == [] and data["figure_files"], name
        assert all((default_report.out / f).is_file() for f in data["figure_files"]), name


def test_save_result_writes_figures_then_the_json_once(tmp_path):
    from interp.plots.save import save_result
    from interp.studies.artifacts.neurons import NeuronsResult

    result = NeuronsResult(model="m", fingerprint="f", params={}, seed=0, ids=["a"],
                           skipped=[{"image": "b.jpg", "reason": "unreadable"}],
                           neurons=[{"layer": 0, "neuron": 1, "score": 2.0}], layer_max_score=[2.0])
    assert save_result(result, tmp_path) == ["neuron_scores.png"]
    data = json.loads((tmp_path / "neurons.json").read_text())
    assert data["figure_files"] == ["neuron_scores.png"] and data["skipped"][0]["image"] == "b.jpg"
    assert NeuronsResult.from_dict(data).skipped == result.skipped


def test_a_shared_baseline_gives_the_same_results(one_thread):
    model = interp.load("planted_vit")
    truth = planted_truth(model)
    neurons = {truth.layer: list(truth.neurons)}
    source = open_source(model=model, images=sample_image_paths()).held()
    found = detect(source, DetectionSpec(threshold="auto"), RunOptions(progress=False))
    base = baseline_pass(source, found.layer, progress=False)
    assert base.patch_norms.shape == found.norms.shape and (base.patch_norms - found.norms).abs().max() < 1e-3
    seen = _count_image_forwards(model)
    for study, kwargs in ((ablate_study, dict(controls=2)), (registers_study, {}), (relocate_study, {})):
        alone = study(source, neurons=neurons, detection=found, progress=False, **kwargs).to_dict()
        before = seen[0]
        shared = study(source, neurons=neurons, detection=found, baseline=base, progress=False,
                       **kwargs).to_dict()
        edited_runs = (seen[0] - before) / len(source)  # the baseline's forward is not run again
        assert shared == alone, alone["study"]
        # ablate: target + 2 controls under each of zero, mean and resample, and the means' one pass
        assert edited_runs == {"ablate": 3 * 3 + 1, "registers": 1, "relocate": 1}[alone["study"]]


def test_one_observational_pass_serves_norms_neurons_probes_and_lost(one_thread):
    """The report's observational studies read one forward per image together, and give what they give alone
    (the neuron scores to float rounding: the shared forward computes attention with its pattern hooks on)."""
    from interp.studies.artifacts.neurons import neurons_reading, neurons_study
    from interp.studies.artifacts.norms import norms_reading, norms_study
    from interp.runtime.passes import run_readings
    from interp.studies.objects.lost import lost_reading, lost_study
    from interp.studies.probes.probes import probes_reading, probes_study

    model = interp.load("planted_vit")
    source = open_source(model=model, images=sample_image_paths()).held()
    found = detect(source, DetectionSpec(threshold="auto"), RunOptions(progress=False))
    probe = dict(detection=found, tasks=("position", "pixels"), max_train_tokens=200, max_test_tokens=100)
    seen = _count_image_forwards(model)
    shared = run_readings(source, [norms_reading(source, found), neurons_reading(source, found, top_k=4),
                                   probes_reading(source, **probe), lost_reading(source)], progress=False)
    assert seen[0] == len(source)  # one forward per image for all four
    alone = [norms_study(source, detection=found, progress=False),
             neurons_study(source, detection=found, top_k=4, progress=False),
             probes_study(source, progress=False, **probe), lost_study(source, progress=False)]
    assert seen[0] == 5 * len(source)  # alone: one pass each
    for a, b in zip(alone, shared):
        a, b = a.to_dict(), b.to_dict()
        if a["study"] == "neurons":
            x, y = a.pop("neurons"), b.pop("neurons")
            assert [(n["layer"], n["neuron"]) for n in x] == [(n["layer"], n["neuron"]) for n in y] and x
            assert [n["score"] for n in x] == pytest.approx([n["score"] for n in y], rel=1e-6)
            assert a.pop("layer_max_score") == pytest.approx(b.pop("layer_max_score"), rel=1e-6)
        assert a == b, a["study"]
