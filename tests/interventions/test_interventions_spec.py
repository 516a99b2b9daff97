"""Intervention specs (JSON) and the one relocation-target grammar: every form gives the mask it names, every
kind reads back its own spec, a new kind needs only its class, and bad input is a clear error."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from conftest import images, make_model
from interp.errors import InterpError
from interp.interventions import (AttentionBias, Intervention, NeuronAblation, Relocation, SelectiveCLS,
                                  TestTimeRegister, interventions_from_spec, masks)
from interp.interventions.spec import intervention_from_dict

GRID = (6, 7)


def cells(mask: torch.Tensor) -> set:
    return {(int(r), int(c)) for r, c in mask.nonzero().tolist()}


# ---------------------------------------------------------------------------------------------- target grammar
def test_text_and_json_forms_name_the_same_cells():
    box = {(r, c) for r in range(1, 4) for c in range(2, 4)}  # top 1, left 2, height 3, width 2
    for form in ("box:1,2,3,2", " Box : 1, 2, 3, 2 ", {"box": [1, 2, 3, 2]}):
        assert cells(masks.parse_target(form, GRID)) == box, form
    flat = {(0, 0), (1, 3), (5, 6)}  # flat index i -> (i // 7, i % 7)
    for form in ("indices:0,10,41", {"indices": [0, 10, 41]}, {"indices": [0, [1, 3], [5, 6]]}):
        assert cells(masks.parse_target(form, GRID)) == flat, form
    for form in (None, "smiley", "SMILEY", {"smiley": []}):
        assert torch.equal(masks.parse_target(form, GRID), masks.smiley(GRID)), form


def test_explicit_masks_keep_their_shape_without_a_grid():
    art = ".#.\n#.#"
    assert cells(masks.parse_target(art, None)) == {(0, 1), (1, 0), (1, 2)}
    assert torch.equal(masks.parse_target([".#.", "#.#"], None), masks.parse_target(art, None))
    assert cells(masks.parse_target([[0, 1], [1, 0]], None)) == {(0, 1), (1, 0)}
    t = torch.zeros(3, 3, dtype=torch.bool)
    t[2, 2] = True
    assert cells(masks.parse_target(t, None)) == {(2, 2)}


@pytest.mark.parametrize("bad,message", [
    ("blob", "unknown target"), ({"circle": [3]}, "unknown target form"), ("box:1,2", "4 integers"),
    ("box:a,b,c,d", "integers"), ("indices:", "at least one"), ("indices:42", "outside"),
    ("box:4,4,3,3", "does not fit"), ([[[1]]], "2-D"),
])
def test_bad_targets_are_clear_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        masks.parse_target(bad, GRID)


def test_named_forms_need_the_grid():
    with pytest.raises(ValueError, match="patch grid"):
        masks.parse_target("smiley", None)


# ---------------------------------------------------------------------------------------------- spec registry
def test_every_kind_reads_back_its_own_spec():
    model, calib = make_model("vit"), images(2, seed=3)
    grid = model.layout.grid
    originals = [
        NeuronAblation({0: [1, 5]}, tokens="patches"),
        NeuronAblation.calibrate_means(model, calib, {1: [2, 3]}),
        Relocation({0: [4]}, target=masks.box(grid, 1, 1, 2, 3), value="layer_max"),
        TestTimeRegister({1: [6]}, n_registers=2, patch_fill="mean"),
        AttentionBias.calibrate(model, calib, {0: [7]}),
        SelectiveCLS(k=3, score="contrib", fft="rfft"),
    ]
    specs = json.loads(json.dumps([iv.to_spec() for iv in originals]))  # through real JSON
    loaded = interventions_from_spec(specs)  # no model, no images: everything is in the spec
    for a, b in zip(loaded, originals):
        assert type(a) is type(b) and a.params() == b.params()
        assert a.tensors().keys() == b.tensors().keys()
        for name in a.tensors():
            assert a.tensors()[name].dtype == b.tensors()[name].dtype
            torch.testing.assert_close(a.tensors()[name], b.tensors()[name], rtol=0, atol=0)


def test_friendly_forms_parse_and_calibrate():
    model, calib = make_model("vit"), images(2, seed=3)
    reloc = intervention_from_dict({"kind": "Relocation", "neurons": {"0": [4]}, "target": "box:1,1,2,2"}, model)
    assert torch.equal(reloc.target, masks.box(model.layout.grid, 1, 1, 2, 2))
    means = intervention_from_dict({"kind": "NeuronAblation", "neurons": {"1": [2]}, "mode": "mean",
                                    "means": {"1": [0.25]}})
    assert means.means[1].tolist() == [0.25]
    calibrated = intervention_from_dict({"kind": "NeuronAblation", "neurons": {"1": [2, 3]}, "mode": "mean"},
                                        model, calib)
    expected = NeuronAblation.calibrate_means(model, calib, {1: [2, 3]})
    torch.testing.assert_close(calibrated.means[1], expected.means[1])
    with pytest.raises(InterpError, match="calibration"):
        intervention_from_dict({"kind": "AttentionBias", "neurons": {"0": [1]}}, model)
    with pytest.raises(InterpError, match="bad Relocation spec.*unknown target"):
        intervention_from_dict({"kind": "Relocation", "neurons": {"0": [4]}, "target": "blob"}, model)
    with pytest.raises(InterpError, match="unknown intervention kind 'Nope'"):
        intervention_from_dict({"kind": "Nope"})


def test_a_new_kind_needs_only_its_class():
    @dataclass(eq=False)
    class ScaleNeurons(Intervention):  # defined here, never mentioned by the spec or patch code
        layer: int
        factor: float = 2.0
        kind = "TestOnlyScaleNeurons"

        def params(self):
            return {"layer": self.layer, "factor": self.factor}

    try:
        (loaded,) = interventions_from_spec([{"kind": "TestOnlyScaleNeurons", "layer": 1, "factor": 0.5}])
        assert isinstance(loaded, ScaleNeurons) and loaded.params() == {"layer": 1, "factor": 0.5}
        assert interventions_from_spec([loaded.to_spec()])[0].params() == loaded.params()
    finally:
        Intervention.registry.pop("TestOnlyScaleNeurons", None)
