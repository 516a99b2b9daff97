"""An original DINOv2 checkpoint loaded at another input size is DINOv2's own model at that size: its 37x37
position table resampled with DINOv2's arithmetic (``tests/reference/dinov2_pos_encoding.py``), compared block by
block at 224 and 448 px on a table that is not smooth; a timm-format file keeps timm's arithmetic unless
``pos_resample`` asks; the method used is recorded (``model.pos_resample``, ``interp hooks``, the study JSON)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

import interp
from interp.cli import main
from interp.errors import ModelLoadError
from interp.runtime.forward import run_hooks

from conftest import images
from reference.dinov2_linear_head import create_linear_input
from reference.dinov2_pos_encoding import PLAIN, REGISTERS, block_outputs, interpolate_pos_encoding

PATCH, SIDE = 14, 37  # the released files: 518 px, a 37x37 table
SMALL = {"embed_dim": 48, "num_heads": 3, "depth": 3}
NAMES = {False: "vit_small_patch14_dinov2", True: "vit_small_patch14_reg4_dinov2"}


def dinov2_state_dict(registers: bool, seed: int = 0, **dims) -> dict:
    """A small state dict in the original DINOv2 format (the released files' key names), every tensor random:
    ``cls_token`` [1, 1, d], ``pos_embed`` [1, 1 + 37*37, d] (CLS row first), ``mask_token`` [1, d],
    ``register_tokens`` [1, 4, d] (with registers), ``patch_embed.proj``, ``blocks.N.*`` (``ls1.gamma``...), ``norm``."""
    g = torch.Generator().manual_seed(seed)
    dims = dims or SMALL
    timm_sd = interp.load(NAMES[registers], pretrained=False, **dims).timm_model.state_dict()
    sd = {}
    for key, t in timm_sd.items():
        if key.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
            sd[key] = 1 + 0.1 * torch.randn(t.shape, generator=g)
        elif key.endswith("gamma"):
            sd[key] = 0.5 + 0.2 * torch.randn(t.shape, generator=g)
        else:
            sd[key] = 0.05 * torch.randn(t.shape, generator=g)
    d = sd["cls_token"].shape[-1]
    sd["cls_token"] = torch.randn(1, 1, d, generator=g)
    sd["pos_embed"] = torch.randn(1, 1 + SIDE * SIDE, d, generator=g)  # no smoothness: resampling shows
    sd["mask_token"] = torch.zeros(1, d)
    if registers:
        sd["register_tokens"] = torch.randn(1, 4, d, generator=g)
        del sd["reg_token"]
    return sd


def save(sd: dict, path) -> str:
    torch.save(sd, path)
    return str(path)


def native(path: str, registers: bool, **dims):
    """The file's model at its own 518 px: nothing resampled."""
    return interp.load(NAMES[registers], weights=path, **(dims or SMALL))


def reference_blocks(sd: dict, path: str, registers: bool, x: torch.Tensor):
    """DINOv2's own forward at ``x``'s size: the table resampled per forward, blocks from the file at 518 px."""
    native_model = native(path, registers)
    assert native_model.img_size == (PATCH * SIDE, PATCH * SIDE) and getattr(native_model, "pos_resample", None) is None
    return block_outputs(sd, native_model.timm_model.blocks, x, PATCH, **(REGISTERS if registers else PLAIN))


def max_relative_differences(model, reference, x):
    _, cache = model.run_with_cache(x, names_filter="blocks.*.hook_resid_post")
    return [float((cache[f"blocks.{i}.hook_resid_post"] - ref).abs().max() / ref.abs().max())
            for i, ref in enumerate(reference)]


@pytest.mark.parametrize("registers", [False, True], ids=["plain", "reg4"])
@pytest.mark.parametrize("size", [224, 448])
def test_a_dinov2_file_at_another_size_is_dinov2s_own_forward(registers, size, tmp_path):
    sd = dinov2_state_dict(registers)
    path = save(sd, tmp_path / "dinov2_pretrain.pth")
    x = images(2, size=size, seed=1)
    reference = reference_blocks(sd, path, registers, x)
    model = interp.load(NAMES[registers], weights=path, img_size=size, **SMALL)
    assert max(max_relative_differences(model, reference, x)) <= 1e-5
    assert model.pos_resample == ("dinov2_reg" if registers else "dinov2")


def test_timm_arithmetic_on_a_dinov2_file_is_another_model(tmp_path):
    """The test above can fail: timm's arithmetic (pos_resample="timm") on the plain file is off by far more."""
    sd = dinov2_state_dict(registers=False)
    path = save(sd, tmp_path / "d.pth")
    x = images(2, size=224, seed=1)
    reference = reference_blocks(sd, path, False, x)
    model = interp.load(NAMES[False], weights=path, img_size=224, pos_resample="timm", **SMALL)
    assert model.pos_resample == "timm"
    assert min(max_relative_differences(model, reference, x)) > 1e-3


def test_a_timm_format_file_keeps_timms_arithmetic_unless_asked(tmp_path):
    native = interp.load(NAMES[False], pretrained=False, **SMALL).timm_model  # timm's own format, 37x37 table
    with torch.no_grad():
        native.pos_embed.normal_()
    path = save(native.state_dict(), tmp_path / "timm.pth")
    timm_way = resample_abs_pos_embed(native.pos_embed.detach(), (16, 16), num_prefix_tokens=1)
    model = interp.load(NAMES[False], weights=path, img_size=224, **SMALL)
    assert model.pos_resample == "timm"
    assert torch.equal(model.timm_model.pos_embed.detach(), timm_way)
    asked = interp.load(NAMES[False], weights=path, img_size=224, pos_resample="dinov2", **SMALL)
    dinov2_way = interpolate_pos_encoding(native.pos_embed.detach(), 256, 224, 224, PATCH, **PLAIN)
    assert asked.pos_resample == "dinov2"
    assert torch.allclose(asked.timm_model.pos_embed.detach(), dinov2_way, rtol=0, atol=1e-6)


def test_hub_weights_go_through_the_same_choice(monkeypatch):
    """The hub path (timm's load_pretrained, faked here: no network) resamples through pos_resample too."""
    import timm.models

    from interp.models import loading

    native = interp.load(NAMES[False], pretrained=False, **SMALL).timm_model
    with torch.no_grad():
        native.pos_embed.normal_()
    hub_sd = {k: v.clone() for k, v in native.state_dict().items()}

    def fake_load_pretrained(model, pretrained_cfg=None, num_classes=None, filter_fn=None):
        model.load_state_dict(filter_fn(dict(hub_sd), model))

    monkeypatch.setattr(loading, "_hub_reachable", lambda *a, **k: True)
    monkeypatch.setattr(timm.models, "load_pretrained", fake_load_pretrained)
    timm_way = interp.load(NAMES[False], img_size=224, **SMALL)
    assert timm_way.pos_resample == "timm"
    assert torch.equal(timm_way.timm_model.pos_embed.detach(),
                       resample_abs_pos_embed(hub_sd["pos_embed"], (16, 16), num_prefix_tokens=1))
    asked = interp.load(NAMES[False], img_size=224, pos_resample="dinov2", **SMALL)
    assert asked.pos_resample == "dinov2"
    dinov2_way = interpolate_pos_encoding(hub_sd["pos_embed"], 256, 224, 224, PATCH, **PLAIN)
    assert torch.allclose(asked.timm_model.pos_embed.detach(), dinov2_way, rtol=0, atol=1e-6)


def test_the_table_at_its_own_size_is_not_resampled(tmp_path):
    path = save(dinov2_state_dict(registers=True), tmp_path / "d.pth")
    assert interp.load(NAMES[True], weights=path, img_size=518, **SMALL).pos_resample is None
    assert interp.load(NAMES[True], pretrained=False, img_size=224, **SMALL).pos_resample is None


def test_an_unknown_method_is_refused():
    with pytest.raises(ModelLoadError, match="unknown pos_resample 'bilinear'; use one of auto"):
        interp.load(NAMES[False], pretrained=False, pos_resample="bilinear", **SMALL)


@pytest.mark.parametrize("registers", [False, True], ids=["plain", "reg4"])
def test_dinov2_linear_head_at_224_px_equals_the_dinov2_repository(registers, tmp_path):
    """DINOv2's released head format on the released backbone at 224 px, where the table is resampled (the
    classifier test builds at the table's own size)."""
    sd = dinov2_state_dict(registers, seed=3)
    path = save(sd, tmp_path / "d.pth")
    x = images(2, size=224, seed=2)
    last = native(path, registers).timm_model.norm(reference_blocks(sd, path, registers, x)[-1])
    n_reg = 4 if registers else 0
    g = torch.Generator().manual_seed(0)
    w, b = 0.05 * torch.randn(5, 2 * SMALL["embed_dim"], generator=g), torch.randn(5, generator=g)
    reference = F.linear(create_linear_input([(last[:, 1 + n_reg:], last[:, 0])], 1, True), w, b)
    torch.save({"weight": w, "bias": b}, tmp_path / "head.pth")
    model = interp.load(NAMES[registers], weights=path, img_size=224, **SMALL)
    bound = interp.load_classifier(tmp_path / "head.pth").bind(model)
    assert bound.n_blocks == 1
    ours = run_hooks(model, x, classifier=bound).logits
    assert (ours - reference).abs().max() <= 1e-5 * reference.abs().max()


def test_the_method_is_shown_by_hooks_and_written_in_the_study_json(tmp_path, capsys, photos16):
    path = save(dinov2_state_dict(registers=False, depth=1), tmp_path / "d.pth")  # ViT-S width, one block
    model = ["vit_small_patch14_dinov2", "--weights", path, "--img-size", "224", "--depth", "1"]
    assert main(["hooks", *model, "--pattern", "hook_embed"]) == 0
    assert "# position table: resampled to 16x16 with dinov2 arithmetic" in capsys.readouterr().out
    assert main(["hooks", *model, "--pos-resample", "timm", "--pattern", "hook_embed"]) == 0
    assert "with timm arithmetic" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["study", "norms", *model, "--images", str(photos16), "--out", str(out), "--no-progress",
                 "--quiet"]) == 0
    assert json.loads((out / "norms.json").read_text())["pos_resample"] == "dinov2"
