"""Model loading (names, local weight files, offline errors), preprocessing and image errors."""
from __future__ import annotations

import socket

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import interp
from interp.errors import ImageError, ModelLoadError, UnsupportedModelError
from interp.models import load_images, planted_truth, sample_image_paths

from conftest import images, make_model


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No network (every connection attempt is recorded and fails) and an empty Hugging Face cache folder:
    (the cache folder, the list of attempted connections)."""
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache), raising=False)
    tried = []  # fast: no connection is attempted (no network timeouts, no retries), whatever the machine's speed

    def connect(*args, **kwargs):
        tried.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", connect)  # the first step of any connection (a name look-up)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    return cache, tried


def test_pretrained_offline_fails_fast_with_actionable_message(offline_hub):
    _, tried = offline_hub
    with pytest.raises(ModelLoadError) as err:
        interp.load("vit_small_patch16_224", depth=1)
    assert tried == []
    msg = str(err.value)
    assert "weights=" in msg and "pretrained=False" in msg and "--no-pretrained" in msg


def test_pretrained_offline_loads_the_hub_weights_from_the_local_cache(offline_hub):
    """The Hugging Face cache as ``huggingface_hub`` lays it out (refs/main -> snapshots/<commit>/model.safetensors)
    for the hub repository of the model's pretrained_cfg: loaded offline, without initialising what it replaces."""
    from unittest import mock

    from safetensors.torch import save_file

    import interp.models.loading as loading

    cache, tried = offline_hub
    saved = timm.create_model("vit_small_patch16_224", pretrained=False, depth=1).eval()
    repo = saved.pretrained_cfg["hf_hub_id"]  # timm/vit_small_patch16_224.augreg_in21k_ft_in1k
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
    save_file(saved.state_dict(), str(folder / "snapshots" / ("0" * 40) / "model.safetensors"))
    with mock.patch.object(loading, "build_architecture", wraps=loading.build_architecture) as build:
        model = interp.load("vit_small_patch16_224", depth=1)
    assert tried == [] and model.init_seed is None
    # the skeleton on the meta device that finds the cached file, then the model built without init
    assert [call.kwargs.get("initialise") for call in build.call_args_list] == [None, False]
    x = images(1)
    with torch.no_grad():
        torch.testing.assert_close(model(x), saved(x), atol=1e-5, rtol=0)


def test_non_vit_and_unknown_names():
    with pytest.raises(UnsupportedModelError, match="a resnet model is not a family interp instruments"):
        interp.load("resnet18", pretrained=False)
    with pytest.raises(ModelLoadError, match="vit_small_patch16_224"):
        interp.load("vit_small_patch16_22", pretrained=False)
    with pytest.raises(UnsupportedModelError, match="overrides"):
        interp.HookedViT.from_timm(timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False))
    with pytest.raises(UnsupportedModelError, match="Linear is not a model family interp instruments"):
        interp.HookedViT.from_timm(torch.nn.Linear(3, 3))


@pytest.mark.parametrize("suffix", [".safetensors", ".pth", ".bin"])
def test_local_weight_files_load(tmp_path, suffix):
    src = make_model("vit", seed=3)
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    else:
        torch.save({"state_dict": src.state_dict()}, path)
    loaded = interp.load("vit_small_patch16_224", weights=path, depth=2)
    x = images(1)
    torch.testing.assert_close(loaded(x), src(x))


def test_original_dinov2_checkpoint_is_converted(tmp_path):
    """A DINOv2-repo style file (mask_token, register_tokens, pos_embed with a CLS row) loads via timm's filter."""
    src = make_model("dinov2_reg", seed=5)
    sd = {k: v.clone() for k, v in src.state_dict().items()}
    cls_pos = torch.randn(1, 1, sd["cls_token"].shape[-1])
    original = {k: v for k, v in sd.items() if k not in ("cls_token", "reg_token", "pos_embed")}
    original["mask_token"] = torch.zeros(1, sd["cls_token"].shape[-1])
    original["register_tokens"] = sd["reg_token"]
    original["cls_token"] = sd["cls_token"] - cls_pos
    original["pos_embed"] = torch.cat([cls_pos, sd["pos_embed"]], dim=1)
    path = tmp_path / "dinov2_vits14_reg4_pretrain.pth"
    torch.save(original, path)
    loaded = interp.load("vit_small_patch14_reg4_dinov2", weights=path, depth=2, img_size=224)
    x = images(1)
    # (cls - pos) + pos is not bit-exact in float32
    torch.testing.assert_close(loaded(x), src(x), atol=1e-4, rtol=1e-4)


def test_weight_file_for_another_architecture_is_clear(tmp_path):
    src = make_model("vit")
    path = tmp_path / "w.pth"
    torch.save(src.state_dict(), path)
    with pytest.raises(ModelLoadError, match="does not fit this architecture: .* of another shape") as e:
        interp.load("vit_base_patch16_224", weights=path, depth=2)
    assert "\n" not in str(e.value) and len(str(e.value)) < 250  # one line, not torch's list of every mismatch
    bad = tmp_path / "garbage.safetensors"
    bad.write_bytes(b"not a tensor file")
    with pytest.raises(ModelLoadError, match="could not read"):
        interp.load("vit_small_patch16_224", weights=bad, depth=2)
    with pytest.raises(ModelLoadError, match="does not exist"):
        interp.load("vit_small_patch16_224", weights=tmp_path / "missing.pth")


def test_wrong_image_size_is_clear():
    model = make_model("vit")
    with pytest.raises(ImageError, match="224x224.*dynamic_img_size"):
        model(images(1, size=160))
    with pytest.raises(ImageError, match="3-channel"):
        model(torch.zeros(1, 1, 224, 224))
    with pytest.raises(ImageError, match="Tensor"):
        model(torch.zeros(3, 224, 224))


def test_load_images_any_mode_and_model_preprocessing(tmp_path):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "a_rgb.png")
    Image.fromarray(rgb[..., 0]).save(tmp_path / "b_gray.png")
    rgba = np.concatenate([rgb, np.full((300, 400, 1), 128, np.uint8)], axis=-1)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "c_rgba.png")
    Image.fromarray(rgb).convert("P").save(tmp_path / "d_palette.gif")
    model = make_model("dinov2_reg")
    batch = load_images(tmp_path, model)
    assert batch.shape == (4, 3, 224, 224) and batch.dtype == torch.float32
    # grayscale -> three equal channels before normalisation
    cfg = model.timm_model.pretrained_cfg
    gray = batch[1] * torch.tensor(cfg["std"]).view(3, 1, 1) + torch.tensor(cfg["mean"]).view(3, 1, 1)
    torch.testing.assert_close(gray[0], gray[1], atol=1e-5, rtol=0)
    assert model(batch).shape[0] == 4


def test_unreadable_image_names_the_file(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff garbage")
    model = make_model("vit")
    with pytest.raises(ImageError, match="broken.jpg"):
        load_images([bad], model)
    with pytest.raises(ImageError, match="does not exist"):
        load_images([tmp_path / "nope.png"], model)
    with pytest.raises(ImageError, match="folder or image file .*missing_dir' does not exist"):
        load_images(tmp_path / "missing_dir", model)  # a mistyped folder is named as such, not "unreadable"


def test_bundled_samples_and_planted_model():
    paths = sample_image_paths()
    assert [p.stem for p in paths] == ["astronaut", "chelsea", "coffee", "rocket"]
    model = interp.load("planted_vit")
    truth = planted_truth(model)
    assert truth is not None and truth.layer == 2 and truth.neurons == (17, 101, 402, 655)
    assert planted_truth(model.timm_model) is truth  # the truth lives on the planted timm module
    assert planted_truth(interp.load("vit_small_patch16_224", pretrained=False, depth=1)) is None
    assert not hasattr(model, "planted")  # not on the hook layer
    x = load_images(paths, model)
    assert x.shape == (4, 3, 224, 224)


def test_planted_ground_truth_on_constructed_images():
    """Flat patches become high-norm tokens from the planted layer's MLP on; textured ones never do."""
    model = interp.load("planted_vit")
    truth = planted_truth(model)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 224, 224, generator=g)
    x[0, :, :64, :64] = 0.4  # 4x4 flat patches
    x[1, :, 96:160, 32:224] = -0.3
    mask = truth.artifact_mask(model.timm_model, x).flatten(1)
    assert mask[0].sum() == 16 and mask[1].sum() == 48
    _, cache = model.run_with_cache(x, names_filter="blocks.*.hook_resid_*")
    patches = model.layout.patch_slice
    for layer in range(model.n_layers):
        post = cache[f"blocks.{layer}.hook_resid_post"][:, patches].norm(dim=-1)
        mid = cache[f"blocks.{layer}.hook_resid_mid"][:, patches].norm(dim=-1)
        if layer < truth.layer:
            assert post.max() < 1.1 * post.min()
        else:
            assert (post[mask].min() > 3 * post[~mask].max()), layer
        if layer == truth.layer:
            assert mid.max() < 1.1 * mid.min()  # the jump is in the MLP, not the attention
