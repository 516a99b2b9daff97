"""Every neuron ablation carries its replacement controls: zero, mean and resample (another image's values), each
against the same random neuron sets, and the headline names the replacement it rests on."""
from __future__ import annotations

import pytest
import torch

import interp
from interp.errors import InterpError
from interp.interventions import NeuronAblation
from interp.studies import open_source
from interp.studies.artifacts.ablate import ablate_study

PLANTED = "2:17,2:101,2:402,2:655"


def test_resample_takes_another_images_values():
    model = interp.load("planted_vit")
    x = interp.load_images(interp.models.inputs.samples.SAMPLES_DIR, model)
    hook = "blocks.2.mlp.hook_post"
    _, intact = model.run_with_cache(x, names_filter=hook)
    edit = NeuronAblation({2: [17, 101]}, mode="resample", seed=1)
    with model.intervene(edit):
        _, edited = model.run_with_cache(x, names_filter=hook)
    before, after = intact[hook][..., [17, 101]], edited[hook][..., [17, 101]]
    for i in range(len(x)):  # each image carries exactly one other image's values; the other neurons are its own
        donors = [j for j in range(len(x)) if torch.equal(after[i], before[j])]
        assert len(donors) == 1 and donors[0] != i
    assert torch.equal(edited[hook][..., :17], intact[hook][..., :17])
    with pytest.raises(InterpError, match="at least two images"):
        interp.load("planted_vit").run_with_interventions(x[:1], [NeuronAblation({2: [17]}, mode="resample")])


def test_ablate_reports_every_replacement_with_its_controls():
    source = open_source(model=interp.load("planted_vit"), images=interp.models.inputs.samples.SAMPLES_DIR)
    result = ablate_study(source, neurons=PLANTED, controls=2, progress=False)
    assert list(result.replacements) == ["zero", "mean", "resample"] and result.mode == "zero"
    removed = {r: v["comparison"]["removed"] for r, v in result.replacements.items()}
    # zero and mean silence the register neurons: the outliers go, the random controls leave them
    for r in ("zero", "mean"):
        assert removed[r]["target"] == 1.0 and max(removed[r]["controls"]) < 0.2
    # another image's register-neuron values keep writing outliers (at that image's positions): the count stays
    assert removed["resample"]["target"] < 0.5
    assert result.replacements["zero"]["target"] == result.conditions["target"]
    assert set(result.conditions) == {"baseline", "target", "control_0", "control_1"}
    assert "replacement: zero" in result.console_lines()[0] and "resample" in result.console_lines()[1]
    only_mean = ablate_study(source, neurons=PLANTED, controls=1, mode="mean", replacements=("mean",),
                             progress=False)
    assert list(only_mean.replacements) == ["mean"]
