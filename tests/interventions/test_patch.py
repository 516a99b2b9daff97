"""Patch files: save -> load into a fresh plain timm model -> same outputs as the hooked model; clear errors
for other models and corrupt files; weight-edit export for plain timm."""
from __future__ import annotations

import copy
import json

import pytest
import timm
import torch

from interp.interventions import export as patch
from conftest import FAMILIES, images, make_model
from interp.errors import PatchError
from interp.interventions import (AttentionBias, NeuronAblation, Relocation, SelectiveCLS, TestTimeRegister,
                                  masks)


def fresh_plain(family: str, model) -> torch.nn.Module:
    """A new plain timm model of ``family`` holding ``model``'s weights (never instrumented)."""
    name, kwargs = FAMILIES[family]
    plain = timm.create_model(name, pretrained=False, **kwargs)
    plain.load_state_dict(model.timm_model.state_dict())
    return plain.eval()


def interventions_for(label, model, calib):
    grid = model.layout.grid
    cases = {
        "zero_ablation": lambda: [NeuronAblation({0: [1, 5], 1: [7]})],
        "mean_ablation_patches": lambda: [NeuronAblation.calibrate_means(model, calib, {0: [3, 4]}, tokens="patches")],
        # 16 neurons: two move a narrow random CLIP's output by only ~1e-4, too close to the comparison's 1e-5
        "relocation": lambda: [Relocation({0: list(range(16))}, target=masks.smiley(grid), value="layer_max")],
        "test_time_register": lambda: [TestTimeRegister({0: [2, 3], 1: [8]}, n_registers=2, patch_fill="outliers")],
        "attention_bias": lambda: [AttentionBias.calibrate(model, calib, {0: [2, 3]})],
        "selective_cls": lambda: [SelectiveCLS(k=2, score="paper", fft="shift")],
        "selective_cls_reference": lambda: [SelectiveCLS()],
        "composition": lambda: [SelectiveCLS(k=1), Relocation({1: [4]}, target=masks.box(grid, 1, 1, 3, 3)),
                                TestTimeRegister({0: [2, 3]}),
                                NeuronAblation({1: [4]}, mode="mean", means={1: torch.tensor([0.3])}),
                                AttentionBias.calibrate(model, calib, {1: [6]})],
    }
    return cases[label]()


ALL_CASES = ("zero_ablation", "mean_ablation_patches", "relocation", "test_time_register", "attention_bias",
             "selective_cls", "selective_cls_reference", "composition")


# Every case on the plain ViT; the structural ones and the composition on a register model and CLIP.
@pytest.mark.parametrize("family,cases", [("vit", ALL_CASES),
                                          ("dinov2_reg", ("test_time_register", "attention_bias", "composition")),
                                          ("clip", ("relocation", "test_time_register", "composition"))])
def test_round_trip_every_intervention(family, cases, tmp_path):
    model, calib, x = make_model(family), images(2, seed=4), images(3)
    template = fresh_plain(family, model)
    keys = set(template.state_dict())
    for label in cases:
        interventions = interventions_for(label, model, calib)
        path = patch.save(interventions, tmp_path / f"{label}.safetensors", model)
        loaded = patch.load(path)
        assert [type(iv) for iv in loaded] == [type(iv) for iv in interventions]
        assert [iv.params() for iv in loaded] == [iv.params() for iv in interventions]
        for a, b in zip(loaded, interventions):
            assert a.tensors().keys() == b.tensors().keys()
            assert all(torch.equal(a.tensors()[k], b.tensors()[k]) for k in a.tensors())
        plain = copy.deepcopy(template)
        patched = patch.apply(plain, path)
        assert patched is plain and set(patched.state_dict()) == keys  # same module, same keys
        assert not any("HookPoint" in type(mod).__name__ for mod in patched.modules())
        with torch.no_grad():
            expected = model.run_with_interventions(x, interventions)
            got = patched(x)
            assert (expected - model(x)).abs().max() > 1e-4, label  # the edit does something
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5, msg=lambda m: f"{label}: {m}")


def test_patched_plain_model_layout_and_forward_features(tmp_path):
    model = make_model("dinov2_reg")
    path = patch.save([TestTimeRegister({0: [1]}, n_registers=3)], tmp_path / "t.safetensors", model)
    plain = patch.apply(fresh_plain("dinov2_reg", model), path)
    assert plain.num_prefix_tokens == 5 + 3
    feats = plain.forward_features(images(1))
    assert feats.shape[1] == 5 + 3 + model.layout.n_patches
    with model.intervene(TestTimeRegister({0: [1]}, n_registers=3)):
        _, cache = model.run_with_cache(images(1), names_filter="hook_norm_final")
    torch.testing.assert_close(feats, cache["hook_norm_final"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["vit", "dinov2_reg"])
def test_patched_plain_selective_cls_is_the_reference(family, tmp_path):
    """A plain timm model patched with SelectiveCLS() pools its final patch tokens as the LaSt reference code."""
    from reference.last_selective import reference_selective_cls

    model, x = make_model(family), images(2, seed=6)
    plain = patch.apply(fresh_plain(family, model), patch.save([SelectiveCLS()], tmp_path / "s.safetensors", model))
    with torch.no_grad():
        tokens = plain.forward_features(x)  # [b, t, d], final norm applied
        g_ref, _ = reference_selective_cls(tokens[:, plain.num_prefix_tokens:])
        torch.testing.assert_close(plain(x), plain.head(plain.fc_norm(g_ref)), rtol=0, atol=1e-5)


def test_interp_patch_is_the_export_module():
    import interp
    import interp.interventions.export as export

    assert interp.patch is export and interp.patch.save is patch.save and interp.patch.apply is patch.apply


def test_other_architecture_or_weights_is_a_clear_error(tmp_path):
    model = make_model("vit")
    path = patch.save([TestTimeRegister({1: [3]})], tmp_path / "p.safetensors", model)
    other_arch = timm.create_model("vit_small_patch16_224", pretrained=False, depth=3).eval()
    with pytest.raises(PatchError, match="force=True"):
        patch.apply(other_arch, path)
    other_weights = fresh_plain("vit", make_model("vit", seed=1))
    with pytest.raises(PatchError, match="other weights"):
        patch.apply(other_weights, path)
    forced = patch.apply(other_weights, path, force=True)  # the same architecture: applies fine
    assert forced.num_prefix_tokens == 2
    clip = fresh_plain("clip", make_model("clip"))
    with pytest.raises(PatchError, match="architecture"):
        patch.apply(clip, path)
    too_deep = patch.save([NeuronAblation({1: [3]})], tmp_path / "deep.safetensors", model)
    shallow = timm.create_model("vit_small_patch16_224", pretrained=False, depth=1).eval()
    with pytest.raises(PatchError, match="does not fit"):
        patch.apply(shallow, too_deep, force=True)


def test_hooked_model_and_double_application_are_refused(tmp_path):
    model = make_model("vit")
    path = patch.save([NeuronAblation({0: [1]})], tmp_path / "p.safetensors", model)
    with pytest.raises(PatchError, match="plain timm model"):
        patch.apply(model, path)
    plain = patch.apply(fresh_plain("vit", model), path)
    with pytest.raises(PatchError, match="already has a patch"):
        patch.apply(plain, path)


def test_corrupt_truncated_and_foreign_files_are_clear_errors(tmp_path):
    from safetensors.torch import save_file

    model = make_model("vit")
    path = patch.save([NeuronAblation.calibrate_means(model, images(2), {0: [1, 2, 3]})], tmp_path / "p.safetensors",
                      model)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) - 5])
    flipped = tmp_path / "flipped.safetensors"
    flipped.write_bytes(data[:-2] + bytes([data[-2] ^ 0xFF]) + data[-1:])
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01 not a patch at all")
    foreign = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    for bad, message in ((truncated, "corrupt or truncated"), (flipped, "checksum"), (garbage, "not a readable"),
                         (foreign, "not an interp patch"), (tmp_path / "missing.safetensors", "does not exist")):
        with pytest.raises(PatchError, match=message):
            patch.apply(fresh_plain("vit", model), bad)
    spec = patch.read_spec(path)
    assert spec["format"] == "interp-patch" and spec["version"] == 1
    assert spec["model_name"] == "vit_small_patch16_224" and len(spec["architecture_fingerprint"]) == 16


def test_weight_edit_export_loads_into_plain_timm(tmp_path):
    from safetensors.torch import load_file

    model, calib, x = make_model("vit"), images(2, seed=9), images(2)
    interventions = [NeuronAblation({0: [1, 5], 1: [7, 8]}),
                     NeuronAblation.calibrate_means(model, calib, {1: [8, 9]})]  # neuron 8: mean wins (last)
    path = patch.export_weights(interventions, model, tmp_path / "edited.safetensors")
    plain = timm.create_model("vit_small_patch16_224", pretrained=False, depth=2).eval()
    plain.load_state_dict(load_file(str(path)))  # strict: the keys are timm's
    with torch.no_grad():
        torch.testing.assert_close(plain(x), model.run_with_interventions(x, interventions), rtol=0, atol=1e-5)
    pth = patch.export_weights(interventions[:1], model, tmp_path / "edited.pth")
    plain.load_state_dict(torch.load(pth, weights_only=True))
    with pytest.raises(PatchError, match="not a pure weight edit"):
        patch.export_weights([NeuronAblation({0: [1]}, tokens="patches")], model, tmp_path / "x.safetensors")
    with pytest.raises(PatchError, match="not a pure weight edit"):
        patch.export_weights([TestTimeRegister({0: [1]})], model, tmp_path / "x.safetensors")


def test_cli_export_show_apply(tmp_path, capsys):
    from PIL import Image

    from interp.cli import main

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([
        {"kind": "TestTimeRegister", "neurons": {"1": [3, 4]}},
        {"kind": "Relocation", "neurons": {"0": [7]}, "target": "smiley"},
        {"kind": "NeuronAblation", "neurons": {"1": [9]}, "mode": "mean"},
        {"kind": "SelectiveCLS", "k": 2},
    ]))
    image_dir = tmp_path / "imgs"
    image_dir.mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(2):
        pixels = (torch.rand(64, 80, 3, generator=g) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(image_dir / f"{i}.png")
    out = tmp_path / "p.safetensors"
    model_args = ["vit_small_patch16_224", "--no-pretrained", "--depth", "2"]
    assert main(["patch", "export", *model_args, "--interventions", str(spec), "--out", str(out),
                 "--calibration-images", str(image_dir)]) == 0
    assert main(["patch", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "TestTimeRegister" in shown and "means.1: [1]" in shown and "target: [14, 14]" in shown
    assert main(["patch", "apply", *model_args, str(out), "--check-images", str(image_dir)]) == 0
    assert "max |plain - hooked|" in capsys.readouterr().out
    # Other weights (another seed): a clear error unless --force.
    assert main(["patch", "apply", *model_args, "--seed", "1", str(out), "--check-images", str(image_dir)]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["patch", "apply", *model_args, "--seed", "1", "--force", str(out),
                 "--check-images", str(image_dir)]) == 0
    weights = tmp_path / "w.safetensors"
    ablation_spec = tmp_path / "ablate.json"
    ablation_spec.write_text(json.dumps({"kind": "NeuronAblation", "neurons": {"0": [1, 2]}}))
    assert main(["patch", "export", *model_args, "--interventions", str(ablation_spec), "--out", str(weights),
                 "--as-weights"]) == 0
    assert weights.is_file()
    bad_spec = tmp_path / "bad.json"
    bad_spec.write_text(json.dumps([{"kind": "Nope"}]))
    assert main(["patch", "export", *model_args, "--interventions", str(bad_spec), "--out", str(out),
                 "--overwrite"]) == 1
    assert "unknown intervention kind" in capsys.readouterr().err
