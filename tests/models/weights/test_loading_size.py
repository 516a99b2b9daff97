"""Input size from a weight file: a file's position grid decides the size unless the user asked for one."""
from __future__ import annotations

import warnings

import pytest
import timm
import torch

import interp
from interp.models.weights.weight_fit import weights_grid

# A 2-block DINOv2-S at 32 px with patch 8 -> a 4x4 grid (the default build is 518 px / patch 14).
SMALL = dict(depth=2, patch_size=8)


def _save(tmp_path, name: str, img_size: int, fmt: str = "safetensors", **kwargs):
    torch.manual_seed(0)
    source = timm.create_model(name, pretrained=False, img_size=img_size, **SMALL, **kwargs).eval()
    path = tmp_path / f"weights.{fmt}"
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    else:
        torch.save(source.state_dict(), str(path))
    return source, path


def _load(name, path, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load(name, weights=str(path), **SMALL, **kwargs)
    messages = [str(w.message) for w in caught if "position grid" in str(w.message)]
    return model, messages


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_file_grid_decides_size_when_none_asked(tmp_path, name):
    source, path = _save(tmp_path, name, img_size=32)
    model, messages = _load(name, path)
    assert model.img_size == (32, 32)
    assert tuple(model.layout.grid) == (4, 4)
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "4x4" in messages[0] and "32 px" in messages[0] and "img_size=518" in messages[0]
    # the loaded model is the saved one, not a resampled copy
    assert torch.equal(model.timm_model.pos_embed, source.pos_embed)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model(x), source(x), atol=1e-5)
    assert interp.models.data_config(model)["input_size"] == (3, 32, 32)


def test_explicit_size_resamples_as_asked(tmp_path):
    name = "vit_small_patch14_dinov2"
    source, path = _save(tmp_path, name, img_size=32, fmt="pth")
    model, messages = _load(name, path, img_size=64)
    assert messages == []
    assert model.img_size == (64, 64)
    assert tuple(model.timm_model.pos_embed.shape) == (1, 1 + 8 * 8, source.embed_dim)


def test_matching_file_says_nothing(tmp_path):
    name = "vit_small_patch14_dinov2"
    _, path = _save(tmp_path, name, img_size=32)
    model, messages = _load(name, path, img_size=32)
    assert messages == [] and model.img_size == (32, 32)


def test_original_dinov2_reg_file_grid(tmp_path):
    """Original DINOv2 checkpoints give CLS (only) a position, also with registers."""
    model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, **SMALL, img_size=32)
    d = model.embed_dim
    original = {"mask_token": torch.zeros(1, d), "register_tokens": torch.zeros(1, 4, d),
                "cls_token": torch.zeros(1, 1, d), "pos_embed": torch.zeros(1, 1 + 6 * 6, d)}
    assert weights_grid(original, model) == (6, 6)
    timm_format = {"pos_embed": torch.zeros(1, 6 * 6, d)}  # reg4 in timm: no_embed_class, no prefix position
    assert weights_grid(timm_format, model) == (6, 6)
    clip = {"visual.positional_embedding": torch.zeros(1 + 7 * 7, d)}
    assert weights_grid(clip, model) == (7, 7)
    assert weights_grid({"pos_embed": torch.zeros(1, 1 + 6 * 6, d)}, model) is None  # 37 tokens: no square
    assert weights_grid({"blocks.0.norm1.weight": torch.zeros(d)}, model) is None


def test_original_dinov2_reg_file_loads_at_its_size(tmp_path):
    """An original (facebookresearch) DINOv2+registers checkpoint at 32 px loads unchanged, not resampled."""
    name = "vit_small_patch14_reg4_dinov2"
    source, _ = _save(tmp_path, name, img_size=32)
    sd = {k: v.clone() for k, v in source.state_dict().items()}
    d = source.embed_dim
    # original layout: CLS carries position 0 (zero here), registers are "register_tokens", plus a mask token
    sd["pos_embed"] = torch.cat([torch.zeros(1, 1, d), sd["pos_embed"]], dim=1)
    sd["register_tokens"] = sd.pop("reg_token")
    sd["mask_token"] = torch.zeros(1, d)
    path = tmp_path / "dinov2_original.pth"
    torch.save(sd, str(path))
    model, messages = _load(name, path)
    assert model.img_size == (32, 32) and len(messages) == 1
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(model(x), source(x), atol=1e-5)
