"""Fine-tuned and training-run weight files: a head with another number of classes, another image size, a
training framework's checkpoint (containers, ``module.``/``_orig_mod.`` prefixes, EMA weights) load with their
own shapes and one line saying what was read; a file that does not fit is refused in one line naming the key."""
from __future__ import annotations

import warnings

import pytest
import timm
import torch

import interp
from interp.errors import ModelLoadError
from interp.models.weights.checkpoints import unwrap_checkpoint

NAME = "vit_small_patch16_224"
SMALL = dict(depth=2, embed_dim=64, num_heads=2)


def _timm(**kw):
    torch.manual_seed(3)
    return timm.create_model(NAME, pretrained=False, **SMALL, **kw).eval()


def _load(path, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load(NAME, weights=path, **SMALL, **kw)
    return model, " | ".join(str(w.message) for w in caught)


def _same_outputs(model, source, size):
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), atol=1e-5, rtol=1e-5)


def test_head_with_other_classes_and_image_size(tmp_path):
    source = _timm(num_classes=7, img_size=64)
    path = tmp_path / "finetune.pth"
    torch.save(source.state_dict(), path)
    model, said = _load(path)
    assert model.timm_model.num_classes == 7 and model.img_size == (64, 64)
    assert "7-class head" in said and "4x4 position grid" in said
    _same_outputs(model, source, 64)


def test_headless_file_builds_without_head(tmp_path):
    source = _timm(num_classes=0, img_size=32)
    path = tmp_path / "backbone.pth"
    torch.save(source.state_dict(), path)
    model, said = _load(path, img_size=32)
    assert model.timm_model.num_classes == 0 and "no classifier" in said
    _same_outputs(model, source, 32)


@pytest.mark.parametrize("layout", ["timm-train", "ddp-compiled", "ema-only", "lightning"])
def test_training_checkpoints_are_unwrapped(tmp_path, layout):
    source = _timm(num_classes=3, img_size=32)
    sd = source.state_dict()
    noise = {k: v + 1 for k, v in sd.items()}  # EMA weights that differ, to see which ones were taken
    checkpoint, want = {
        "timm-train": ({"epoch": 4, "arch": NAME, "state_dict": sd, "state_dict_ema": noise, "optimizer": {}},
                       ["'state_dict'", "EMA weights under 'state_dict_ema'"]),
        "ddp-compiled": ({"model": {f"module._orig_mod.{k}": v for k, v in sd.items()}, "epoch": 1},
                         ["'model'", "'module.' and '_orig_mod.'"]),
        "ema-only": ({"model_ema": {f"module.{k}": v for k, v in sd.items()}}, ["EMA weights under 'model_ema'"]),
        "lightning": ({"state_dict": {f"model.{k}": v for k, v in sd.items()}, "global_step": 9}, ["'model.'"]),
    }[layout]
    path = tmp_path / "run.pth"
    torch.save(checkpoint, path)
    model, said = _load(path, img_size=32)
    for words in want:
        assert words in said, said
    _same_outputs(model, source, 32)


def test_plain_state_dict_says_nothing():
    sd = {"a": torch.zeros(1)}
    assert unwrap_checkpoint(sd) == (sd, None)


@pytest.mark.parametrize("change, key", [(dict(depth=3), "blocks.2"), (dict(embed_dim=96, num_heads=2), "cls_token")])
def test_mismatched_file_is_refused_naming_the_key(tmp_path, change, key):
    torch.manual_seed(0)
    kw = dict(SMALL, img_size=32, **change)
    other = timm.create_model(NAME, pretrained=False, **kw)
    path = tmp_path / "other.pth"
    torch.save(other.state_dict(), path)
    with pytest.raises(ModelLoadError) as e:
        interp.load(NAME, weights=path, img_size=32, **SMALL)
    assert key in str(e.value) and "\n" not in str(e.value), str(e.value)


REGISTERS = dict(depth=2, img_size=56)  # a 4 x 4 grid of 14-px patches


def _dinov2_file(tmp_path, name):
    """A random ``name`` (DINOv2, patch 14) at 56 px and 2 blocks, every weight moved off timm's constants, saved."""
    from safetensors.torch import save_file

    torch.manual_seed(5)
    source = timm.create_model(name, pretrained=False, **REGISTERS).eval()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    return source, path


def test_a_file_that_adds_registers_builds_with_the_files_count(tmp_path):
    """A fine-tune of vit_small_patch14_reg4_dinov2 given to the plain vit_small_patch14_dinov2 builds with 4
    registers and DINOv2-reg's layout (neither CLS nor the registers carry a position) and computes timm's own reg4
    model; at another size its position table is resampled as timm resamples the reg4 model's."""
    source, path = _dinov2_file(tmp_path, "vit_small_patch14_reg4_dinov2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load("vit_small_patch14_dinov2", weights=path, **REGISTERS)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and ("holds 4 register tokens: built vit_small_patch14_dinov2 with reg_tokens=4, "
                               "no_embed_class=True (its own: 0), as timm's vit_small_patch14_reg4_dinov2") in said[0]
    assert model.layout.n_registers == 4 and model.layout.grid == (4, 4)
    _same_outputs(model, source, 56)
    resized, _ = _load_dinov2(path, img_size=70)
    source.set_input_size(img_size=(70, 70))  # timm's resampling of its own model's table
    _same_outputs(resized, source, 70)


def test_a_file_without_registers_drops_the_names_registers(tmp_path):
    source, path = _dinov2_file(tmp_path, "vit_small_patch14_dinov2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load("vit_small_patch14_reg4_dinov2", weights=path, **REGISTERS)
    assert "built vit_small_patch14_reg4_dinov2 with reg_tokens=0, no_embed_class=False (its own: 4)" in str(
        caught[0].message)
    assert model.layout.n_registers == 0
    _same_outputs(model, source, 56)


def _load_dinov2(path, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load("vit_small_patch14_dinov2", weights=path, **dict(REGISTERS, **kw))
    return model, [str(w.message) for w in caught]
