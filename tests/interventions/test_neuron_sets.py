"""Every form of a neuron set is read; a bad one is refused with one clear error line."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

import interp
from interp.errors import InterpError

from conftest import make_model


# ------------------------------------------------------------------------------------------ neuron sets
def _neurons_json(path, model, entries=((0, 3), (0, 7), (1, 2))):
    from interp.models.fingerprint import weights_fingerprint

    path.write_text(json.dumps({"study": "neurons", "model": model.model_name,
                                "fingerprint": weights_fingerprint(model), "params": {}, "seed": 0,
                                "neurons": [{"layer": l, "neuron": n, "score": 1.0} for l, n in entries]}))
    return path


def test_interventions_take_every_neuron_form(tmp_path):
    from interp.interventions import NeuronAblation, Relocation, TestTimeRegister
    from interp.studies.artifacts.neurons import NeuronsResult

    model = make_model("vit")
    path = _neurons_json(tmp_path / "neurons.json", model)
    result = NeuronsResult.from_json(path)
    want = {0: [3, 7], 1: [2]}
    x = torch.randn(1, 3, 224, 224)
    for form in (want, "0:3,0:7,1:2", str(path), path, result):
        for edit in (NeuronAblation(form), TestTimeRegister(form), Relocation(form, target=torch.ones(14, 14))):
            assert edit.neurons == want, (form, type(edit).__name__)
        with model.intervene(NeuronAblation(form)):
            model(x)


def test_neurons_ranked_on_another_model_are_refused_unless_forced(tmp_path):
    from interp.interventions import NeuronAblation, TestTimeRegister

    other = make_model("vit", seed=1)
    model = make_model("vit")
    path = _neurons_json(tmp_path / "neurons.json", other)
    x = torch.randn(1, 3, 224, 224)
    for edit in (NeuronAblation(path), TestTimeRegister(str(path))):
        with pytest.raises(InterpError, match=r"ranked on vit_small_patch16_224 \(weights \w+\), not on this "
                                              r"vit_small_patch16_224 \(weights \w+\).*force=True"):
            with model.intervene(edit):
                model(x)
    with model.intervene(NeuronAblation(path, force=True)):
        model(x)
    with other.intervene(NeuronAblation(path)):  # the model it was ranked on
        other(x)


BAD_NEURONS = [("", "empty"), ("2:x", "cannot read '2:x'"), ("2:17,2:17", "listed twice"), (3.5, "float"),
               ("missing.json", "does not exist")]


@pytest.mark.parametrize("form,message", BAD_NEURONS)
def test_bad_neuron_forms_are_one_line(form, message):
    from interp.interventions import NeuronAblation

    with pytest.raises(InterpError, match=message):
        NeuronAblation(form)


@pytest.mark.parametrize("content,message", [("{", "cannot read neurons file"), ('{"a": 1}', "not a neurons study"),
                                             ('{"neurons": []}', "ranks no neurons"),
                                             ('{"neurons": [{"layer": true, "neuron": 1}]}', "integers"),
                                             ('{"neurons": [1, 2]}', "not a neurons study")])
def test_bad_neurons_json_is_one_line(tmp_path, content, message):
    from interp.interventions import TestTimeRegister

    path = tmp_path / "n.json"
    path.write_text(content)
    with pytest.raises(InterpError, match=message):
        TestTimeRegister(path)


@pytest.mark.parametrize("n", [20000, 50000, 10**7])
def test_too_many_test_time_registers_are_refused_at_once(n):
    from interp.interventions import TestTimeRegister

    with pytest.raises(InterpError, match=rf"n_registers={n} is more than 1024.*MAX_REGISTERS"):
        TestTimeRegister({0: [1]}, n_registers=n)


def test_cli_refuses_foreign_neurons_json_in_one_line(tmp_path, capsys):
    from interp.cli import main

    img = tmp_path / "imgs"
    img.mkdir()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(img / "a.png")
    other = interp.load("vit_small_patch16_224", pretrained=False, depth=1, seed=7)
    path = _neurons_json(tmp_path / "neurons.json", other, entries=((0, 3),))
    args = ["study", "ablate", "vit_small_patch16_224", "--no-pretrained", "--depth", "1", "--images", str(img),
            "--neurons", str(path), "--controls", "1", "--no-progress"]
    assert main(args + ["--out", str(tmp_path / "o1")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ranked on" in err[0] and "--force" in err[0] and "Traceback" not in err[0]
    assert main(args + ["--out", str(tmp_path / "o2"), "--force", "--quiet"]) == 0
