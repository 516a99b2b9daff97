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
