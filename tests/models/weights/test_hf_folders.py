"""Hugging Face ``transformers`` folders as interp models: per class, a random-init ``transformers`` model built
here from a tiny config, saved with ``save_pretrained`` and loaded through ``interp.load(folder)``, gives every
block's residual stream and the output of its own forward (``output_hidden_states=True``), at the suite's 1e-5
float32 tolerance; the keys it holds are all accounted for, its preprocessing and class names are read."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import interp
from conftest import one_error_line
from interp.errors import ModelLoadError, UnsupportedModelError
from interp.models.inputs.preprocessing import data_config
from interp.runtime.forward import run_hooks

transformers = pytest.importorskip("transformers")

TOL = 1e-5
SAMPLES = Path(interp.__file__).parent / "data" / "samples"
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)


def _vit(**kw):
    return transformers.ViTConfig(**SMALL, intermediate_size=96, **kw)


def _siglip_vision(**kw):
    return dict(SMALL, intermediate_size=96, **kw)


# case -> (transformers class, its config, what its output is on interp's side)
CASES = {
    "vit": ("ViTModel", lambda: _vit(), "features"),
    "vit-classifier": ("ViTForImageClassification",
                       lambda: _vit(num_labels=3, id2label={0: "cat", 1: "dog", 2: "fox"},
                                    label2id={"cat": 0, "dog": 1, "fox": 2}, hidden_act="gelu_new"), "logits"),
    "dinov2": ("Dinov2Model", lambda: transformers.Dinov2Config(**SMALL, mlp_ratio=2, layerscale_value=0.5),
               "features"),
    "dinov2-swiglu": ("Dinov2Model", lambda: transformers.Dinov2Config(**SMALL, mlp_ratio=2, use_swiglu_ffn=True),
                      "features"),
    "dinov2-registers": ("Dinov2WithRegistersModel",
                         lambda: transformers.Dinov2WithRegistersConfig(**SMALL, mlp_ratio=2, num_register_tokens=3),
                         "features"),
    "dinov2-classifier": ("Dinov2ForImageClassification", lambda: transformers.Dinov2Config(
        **SMALL, mlp_ratio=2, num_labels=3, id2label={0: "cat", 1: "dog", 2: "fox"}), "classifier-file"),
    "dinov2-registers-classifier": ("Dinov2WithRegistersForImageClassification",
                                    lambda: transformers.Dinov2WithRegistersConfig(
                                        **SMALL, mlp_ratio=2, num_register_tokens=2, num_labels=4), "classifier-file"),
    "dinov3": ("DINOv3ViTModel", lambda: transformers.DINOv3ViTConfig(**SMALL, intermediate_size=96,
                                                                      num_register_tokens=2), "features"),
    "dinov3-gated": ("DINOv3ViTModel", lambda: transformers.DINOv3ViTConfig(
        **SMALL, intermediate_size=96, use_gated_mlp=True, hidden_act="silu", mlp_bias=False, proj_bias=False,
        query_bias=False), "features"),
    "clip": ("CLIPVisionModel", lambda: transformers.CLIPVisionConfig(**SMALL, intermediate_size=96), "pooled"),
    "clip-projection": ("CLIPVisionModelWithProjection",
                        lambda: transformers.CLIPVisionConfig(**SMALL, intermediate_size=96, projection_dim=16),
                        "image_embeds"),
    "clip-classifier": ("CLIPForImageClassification", lambda: transformers.CLIPConfig(
        vision_config=_siglip_vision(), num_labels=4), "logits"),
    "siglip": ("SiglipVisionModel", lambda: transformers.SiglipVisionConfig(**SMALL, intermediate_size=96),
               "pooled"),
    "siglip-no-head": ("SiglipVisionModel", lambda: transformers.SiglipVisionConfig(
        **SMALL, intermediate_size=96, vision_use_head=False), "features"),
    "siglip-classifier": ("SiglipForImageClassification", lambda: transformers.SiglipConfig(
        vision_config=_siglip_vision(), num_labels=5), "logits"),
}


def _randomise(model: torch.nn.Module) -> None:
    """Every parameter drawn at random (transformers' init leaves biases, LayerScale and norms at constants that
    would hide a mixed-up key)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm_gain = ("norm" in name or "layrnorm" in name) and name.endswith("weight")
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if norm_gain else 0.0))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """case -> (folder, the transformers model in eval mode); built once per module."""
    out = {}
    root = tmp_path_factory.mktemp("hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        for case, (cls_name, config, _) in CASES.items():
            torch.manual_seed(0)
            model = getattr(transformers, cls_name)(config()).eval()
            _randomise(model)
            model.save_pretrained(root / case)
            out[case] = (root / case, model)
    (root / "vit" / "preprocessor_config.json").write_text(json.dumps({
        "do_normalize": True, "image_mean": [0.1, 0.2, 0.3], "image_std": [0.4, 0.5, 0.6], "resample": 2,
        "size": {"shortest_edge": 40}, "do_center_crop": True, "crop_size": {"height": 32, "width": 32}}))
    return out


def _load(folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load(str(folder))
    return model, [str(w.message) for w in caught]


def _reference_output(model, kind: str, out):
    if kind in ("logits", "classifier-file"):
        return out.logits
    if kind == "image_embeds":
        return out.image_embeds
    if kind == "pooled":
        return out.pooler_output
    return out.last_hidden_state


def _interp_output(model, folder, kind: str, x, logits, cache):
    """interp's side of ``_reference_output``: a Dinov2ForImageClassification's logits are its classifier file's."""
    if kind == "classifier-file":
        return run_hooks(model, x, classifier=interp.load_classifier(str(folder))).logits
    return {"features": cache["hook_norm_final"], "logits": logits, "image_embeds": logits, "pooled": logits}[kind]


@pytest.mark.parametrize("case", list(CASES))
def test_blocks_and_output_equal_transformers(saved, case):
    folder, reference = saved[case]
    kind = CASES[case][2]
    model, notes = _load(folder)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = reference(pixel_values=x, output_hidden_states=True)
        names = [model.block_names.hook(i, "hook_resid_post") for i in range(model.n_layers)]
        logits, cache = model.run_with_cache(x, names_filter=lambda n: n in names + ["hook_norm_final"])
    hidden = out.hidden_states
    assert len(hidden) == model.n_layers + 1
    for i, name in enumerate(names):
        torch.testing.assert_close(cache[name], hidden[i + 1], atol=TOL, rtol=TOL, msg=f"{case} {name}")
    want = _reference_output(reference, kind, out)
    torch.testing.assert_close(_interp_output(model, folder, kind, x, logits, cache), want, atol=TOL, rtol=TOL)
    layout = model.layout
    n_reg = getattr(reference.config, "num_register_tokens", 0) or 0
    assert layout.n_registers == n_reg and layout.n_patches == 16
    assert layout.cls_index == (None if case.startswith("siglip") else 0)
    assert len(notes) == 1 and CASES[case][0] in notes[0], notes


def test_preprocessing_and_class_names(saved):
    model, _ = _load(saved["vit"][0])
    cfg = data_config(model)
    assert cfg["mean"] == (0.1, 0.2, 0.3) and cfg["std"] == (0.4, 0.5, 0.6)
    assert cfg["interpolation"] == "bilinear" and cfg["crop_pct"] == pytest.approx(0.8)
    classifier, notes = _load(saved["vit-classifier"][0])
    assert classifier.timm_model.pretrained_cfg["label_names"] == ["cat", "dog", "fox"]
    assert "pooler" not in notes[0]  # ViTForImageClassification has no pooler
    _, notes = _load(saved["vit"][0])
    assert "vit.pooler" not in notes[0] and "pooler.dense.weight" in notes[0]  # said, not silently dropped


def test_left_over_and_missing_keys_are_named(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = saved["dinov2"][0]
    sd = load_file(str(folder / "model.safetensors"))
    for name, edit in (("extra", lambda d: d.update({"encoder.layer.0.adapter.weight": torch.zeros(2)})),
                       ("missing", lambda d: d.pop("encoder.layer.1.norm2.bias"))):
        target = tmp_path / name
        target.mkdir()
        (target / "config.json").write_text((folder / "config.json").read_text())
        broken = dict(sd)
        edit(broken)
        save_file(broken, str(target / "model.safetensors"))
        with pytest.raises(ModelLoadError) as e:
            interp.load(str(target))
        assert ("encoder.layer.0.adapter.weight" if name == "extra" else "blocks.1.norm2.bias") in str(e.value)
        assert "\n" not in str(e.value)


def test_unsupported_class_names_the_supported_ones(saved, tmp_path):
    config = json.loads((saved["vit"][0] / "config.json").read_text())
    config["architectures"] = ["BeitModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as e:
        interp.load(str(tmp_path))
    assert "ViTModel" in str(e.value) and "register_family" in str(e.value) and "\n" not in str(e.value)


def test_hub_ids_offline_from_the_local_cache_or_one_line(saved, monkeypatch, tmp_path):
    """A hub id is read from the local Hugging Face cache (laid out as huggingface_hub does); one without a local
    copy fails in one line before anything is built."""
    import shutil

    import huggingface_hub.constants as constants

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache), raising=False)
    repo = cache / "models--someone--tiny-clip"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(saved["clip"][0], repo / "snapshots" / ("0" * 40))
    model, notes = _load("someone/tiny-clip")
    assert model.n_layers == 2 and "CLIPVisionModel" in notes[0]
    with pytest.raises(ModelLoadError) as e:
        interp.load("someone/not-cached-vit")
    assert "no local copy" in str(e.value) and "\n" not in str(e.value)


def test_a_transformers_model_runs_the_report_and_takes_a_patch_file(saved, tmp_path):
    """A loaded folder is an ordinary interp model: ``interp report`` (detection, norms, neurons, ablation,
    test-time registers, relocation, probes, LOST, redundancy) runs on it from the command line, an ablation
    saved as a patch file applies to the plain timm model the folder loads as, and the explorer runs an edit."""
    from interp.cli import main
    from interp.interventions import NeuronAblation
    from interp.models.weights.hf_folder import load_hf_folder

    folder = saved["dinov2-registers"][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["report", str(folder), "--images", str(SAMPLES), "--out", str(tmp_path / "r"),
                     "--no-progress", "--quiet"]) == 0
        model, _ = _load(folder)
        plain = load_hf_folder(folder)
    assert json.loads((tmp_path / "r" / "report.json").read_text())["n_images"] == 4
    path = interp.patch.save([NeuronAblation({1: [3, 17]})], tmp_path / "ablate.safetensors", model)
    plain = interp.patch.apply(plain, path)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        edited = model.run_with_interventions(x, interp.patch.load(path))
        torch.testing.assert_close(plain(x), edited, atol=TOL, rtol=TOL)
        assert (edited - model(x)).abs().max() > 1e-4
    pytest.importorskip("starlette", reason="the explore extra is not installed")
    from interp.explore.session import ExploreSession

    session = ExploreSession(model, interp.models.sample_image_paths())
    assert session.info()["grid"] == [4, 4] and session.info()["has_cls"]
    out = session.run(1, [{"kind": "NeuronAblation", "neurons": {"1": [3]}}])
    assert [len(row) for row in out["norms"]] == [16, 16]  # each block's patch norms on the 4 x 4 grid


def test_the_command_line_takes_a_folder_as_model_or_weights(saved, capsys):
    from interp.cli import main

    folder = str(saved["dinov3"][0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["hooks", folder, "--pattern", "blocks.1.attn.hook_rot_q"]) == 0
        assert "blocks.1.attn.hook_rot_q" in capsys.readouterr().out
        assert main(["hooks", "vit_small_patch16_dinov3", "--weights", folder, "--pattern", "blocks.1.hook_resid_post"]) == 0
        assert "[1, 19, 64]" in capsys.readouterr().out  # CLS + 2 registers + 16 patches, width 64
        assert main(["hooks", "vit_small_patch16_224", "--weights", folder]) == 1  # as any file that does not fit
    line = one_error_line(capsys.readouterr().err)
    assert "DINOv3ViTModel" in line and "pass the folder as MODEL" in line


@pytest.mark.parametrize("size", [24, (48, 40)], ids=["24px", "48x40px"])
@pytest.mark.parametrize("case", list(CASES))
def test_another_input_size_equals_transformers_interpolate_pos_encoding(saved, case, size):
    """``img_size`` other than the config's: the position table resampled once as ``interpolate_pos_encoding``
    resamples it at every forward (bicubic to the grid, antialiased only in Dinov2WithRegisters; a 3 x 3 grid from
    the 4 x 4 table is where antialiasing counts), DINOv3's RoPE normalised per grid; every block equals
    ``transformers``' forward at that size (ViT, CLIP, SigLIP: ``interpolate_pos_encoding=True``)."""
    folder, reference = saved[case]
    cls_name, _, kind = CASES[case]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load(str(folder), img_size=size)
    hw = (size, size) if isinstance(size, int) else size
    x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(3))
    flag = {} if cls_name.startswith(("Dinov2", "DINOv3")) else dict(interpolate_pos_encoding=True)
    with torch.no_grad():
        out = reference(pixel_values=x, output_hidden_states=True, **flag)
        names = [model.block_names.hook(i, "hook_resid_post") for i in range(model.n_layers)]
        logits, cache = model.run_with_cache(x, names_filter=lambda n: n in names + ["hook_norm_final"])
    for i, name in enumerate(names):
        torch.testing.assert_close(cache[name], out.hidden_states[i + 1], atol=TOL, rtol=TOL, msg=f"{case} {name}")
    torch.testing.assert_close(_interp_output(model, folder, kind, x, logits, cache),
                               _reference_output(reference, kind, out), atol=TOL, rtol=TOL)
    assert model.layout.grid == (hw[0] // 8, hw[1] // 8)
    method = None if case.startswith("dinov3") else "dinov2_reg" if case.startswith("dinov2-registers") else (
        "transformers")
    assert model.pos_resample == method
    assert "(config.json: 32 px" in str(caught[-1].message)


def test_timms_antialiased_table_is_another_model_where_it_shrinks(saved):
    """The check above can fail: timm's arithmetic (antialiased) at 24 px is not transformers' ViT."""
    folder, reference = saved["vit"]
    x = torch.randn(1, 3, 24, 24, generator=torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = interp.load(str(folder), img_size=24, pos_resample="timm")
    with torch.no_grad():
        want = reference(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
        _, cache = model.run_with_cache(x, names_filter="hook_norm_final")
    assert model.pos_resample == "timm" and (cache["hook_norm_final"] - want).abs().max() > 1e-3


def test_the_defaults_interp_assumes_are_the_config_classes(saved):
    """A config.json may omit the values that equal its class's defaults; interp's table of them
    (``HF_DEFAULTS``) is the installed transformers' own."""
    from interp.models.weights.hf_config import HF_DEFAULTS

    classes = {"vit": "ViTConfig", "dinov2": "Dinov2Config", "dinov2_with_registers": "Dinov2WithRegistersConfig",
               "dinov3_vit": "DINOv3ViTConfig", "clip_vision_model": "CLIPVisionConfig",
               "siglip_vision_model": "SiglipVisionConfig"}
    assert set(classes) == set(HF_DEFAULTS)
    for model_type, defaults in HF_DEFAULTS.items():
        actual = getattr(transformers, classes[model_type])().to_dict()
        assert {k: actual[k] for k in defaults} == defaults, model_type


def test_a_folder_refuses_kwargs_that_would_change_it(saved):
    with pytest.raises(ModelLoadError, match=r"ViTModel, built as its config.json says \(32 px, 2 blocks\): depth "
                                             r"cannot change it \(img_size can"):
        interp.load(str(saved["vit"][0]), depth=1)
    with pytest.raises(ModelLoadError, match=r"img_size 36 for .*: give a multiple of its 8-px patch \(e.g. 32\)"):
        interp.load(str(saved["vit"][0]), img_size=36)


def test_the_command_line_offers_every_resampling_the_loader_takes():
    import dataclasses

    from interp.commands.groups import ModelOptions
    from interp.models.weights.pos_table import POS_RESAMPLE_CHOICES

    field = {f.name: f for f in dataclasses.fields(ModelOptions)}["pos_resample"]
    assert field.metadata["flag"].choices == POS_RESAMPLE_CHOICES


def test_a_dinov2_classifier_folder_is_the_backbone_and_a_classifier_file(saved):
    """Dinov2ForImageClassification: interp.load(folder) is the backbone (no timm head computes [CLS, patch mean]),
    its one line names the classifier file; interp.load_classifier(folder) is that head, its classes the id2label;
    another class's folder is not a classifier file."""
    from interp.models.classifiers.classifier import ClassifierError

    folder = saved["dinov2-classifier"][0]
    model, notes = _load(folder)
    assert model.timm_model.num_classes == 0 and "3-class classifier reads [CLS, patch mean]" in notes[0]
    clf = interp.load_classifier(str(folder))
    assert (clf.kind, clf.n_blocks, clf.avgpool, clf.class_names) == ("dinov2_linear", 1, True, ["cat", "dog", "fox"])
    with pytest.raises(ClassifierError) as e:
        interp.load_classifier(str(saved["vit-classifier"][0]))
    assert "its head (if any) is the model's own" in str(e.value) and "\n" not in str(e.value)


def test_the_command_line_takes_a_dinov2_classifier_folder_as_classifier(saved, tmp_path, capsys):
    """--classifier takes the folder itself (its head read from it), and refuses a folder that is no model."""
    import argparse

    from interp.cli import main
    from interp.models import sample_image_paths
    from interp.paths import classifier_source

    folder = str(saved["dinov2-classifier"][0])
    assert classifier_source(folder) == folder
    with pytest.raises(argparse.ArgumentTypeError, match="without config.json"):
        classifier_source(str(tmp_path))
    out, listed = tmp_path / "ablate", tmp_path / "images.txt"
    listed.write_text("\n".join(str(p) for p in sample_image_paths()[:2]) + "\n")
    argv = ["study", "ablate", folder, "--images", str(listed), "--neurons", "0:1,0:2", "--controls", "1", "--replacements", "zero", "--classifier", folder,
            "--out", str(out), "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads((out / "ablate.json").read_text())
    assert data["classifier"]["kind"] == "dinov2_linear"
