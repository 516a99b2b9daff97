"""CLIP presets run the architecture Jiang et al. measured: a CLIP image tower with QuickGELU MLPs, read from the
modules (small random-init timm models)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import interp
from interp.errors import InterpError
from interp.models.families.traits import activation_kind, is_clip_tower, mlp_activation
from interp.studies import open_source
from interp.studies.artifacts.norms import norms_study
from interp.detection.presets import CLIP_PRESETS, check_preset_model

QUICK, GELU = "vit_base_patch16_clip_quickgelu_224", "vit_base_patch16_clip_224"


def small(name, **kw):
    return interp.load(name, pretrained=False, depth=2, **kw)


def photos(model, n=2):
    return interp.load_images(interp.models.sample_image_paths()[:n], model)


def test_activations_are_read_from_what_the_module_computes():
    from timm.layers import QuickGELU

    assert activation_kind(QuickGELU()) == "quick_gelu" and activation_kind(nn.GELU()) == "gelu"
    assert activation_kind(nn.GELU(approximate="tanh")) == "gelu_tanh" and activation_kind(nn.ReLU()) == "ReLU"

    class Custom(nn.Module):  # a QuickGELU under another class name
        def forward(self, x):
            return x * torch.sigmoid(1.702 * x)

    assert activation_kind(Custom()) == "quick_gelu"
    model = small(GELU)
    assert is_clip_tower(model.timm_model) and mlp_activation(model.timm_model) == "gelu"
    model.timm_model.blocks[1].mlp.act = QuickGELU()
    assert mlp_activation(model.timm_model) == "gelu (block 1: quick_gelu)"
    assert not is_clip_tower(small("vit_tiny_patch16_224").timm_model)


@pytest.mark.parametrize("preset", sorted(CLIP_PRESETS))
def test_clip_presets_refuse_gelu_and_non_clip_models_naming_the_quickgelu_one(preset):
    fit = CLIP_PRESETS[preset][0]
    check_preset_model(preset, small(QUICK))  # accepted (the L/14 preset too: only CLIP-ness and QuickGELU)
    with pytest.raises(InterpError) as e:
        check_preset_model(preset, small(GELU))
    assert f"{GELU}'s MLP activation is gelu: load {fit} with" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InterpError, match=f"vit_tiny_patch16_224 is not one .*load {fit}"):
        check_preset_model(preset, small("vit_tiny_patch16_224"))
    check_preset_model("darcet", small("vit_tiny_patch16_224"))  # other presets take any model
    check_preset_model(preset, None)  # a cache source: no module to read


def test_the_module_decides_not_the_name():
    from timm.layers import QuickGELU

    renamed = small(GELU)  # a GELU name whose MLPs compute QuickGELU
    for block in renamed.timm_model.blocks:
        block.mlp.act = QuickGELU()
    check_preset_model("jiang-openclip-b16", renamed)
    plain = small(QUICK)  # a QuickGELU name whose MLPs compute GELU
    for block in plain.timm_model.blocks:
        block.mlp.act = nn.GELU()
    with pytest.raises(InterpError, match="MLP activation is gelu"):
        check_preset_model("openclip_b16", plain)


def test_studies_under_a_clip_preset_check_the_model():
    from interp.studies.artifacts.relocate import relocate_study
    from interp.detection.detection import detect
    from interp.detection.spec import DetectionSpec

    quick = small(QUICK)
    r = norms_study(open_source(model=quick, images=photos(quick)), detection=DetectionSpec(preset="jiang-openclip-b16"), progress=False)
    assert r.preset == "jiang-openclip-b16" and r.threshold == 30.0
    gelu = small(GELU)
    source = open_source(model=gelu, images=photos(gelu))
    with pytest.raises(InterpError, match=f"load {QUICK} with the laion2b weights"):
        norms_study(source, detection=DetectionSpec(preset="jiang-openclip-b16"), progress=False)
    with pytest.raises(InterpError, match="MLP activation is gelu"):
        detect(source, DetectionSpec(preset="jiang-openai-clip-b16"))
    with pytest.raises(InterpError, match="MLP activation is gelu"):  # the detection made from its own pass
        relocate_study(source, detection=DetectionSpec(preset="jiang-openclip-b16"), neurons={0: [1]}, progress=False)


def test_the_cli_refuses_in_one_line(tmp_path, capsys):
    from interp.cli import main

    rc = main(["study", "norms", GELU, "--no-pretrained", "--depth", "2", "--preset", "jiang-openclip-b16",
               "--images", str(interp.models.sample_image_paths()[0]), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and f"load {QUICK} with the laion2b weights" in err
