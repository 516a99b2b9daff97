"""Weights: seeded random weights, and every bad weight file refused with one clear error line."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
from PIL import Image

import interp
from interp.models.loading import VALUE_FILLS


# ------------------------------------------------------------------------------------------ seeded random weights
def test_random_weights_are_seeded_and_recorded():
    from interp.models.fingerprint import weights_fingerprint

    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is left alone
    torch.manual_seed(999)  # another global state: same weights anyway
    b = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    c = interp.load("vit_small_patch16_224", pretrained=False, depth=1, seed=1)
    assert weights_fingerprint(a) == weights_fingerprint(b) != weights_fingerprint(c)
    assert (a.init_seed, c.init_seed) == (0, 1)


class _ParameterFills(torch.overrides.TorchFunctionMode):
    """Counts initialiser calls (``interp.models.loading.VALUE_FILLS`` but ``copy_``, which loads a state dict) on
    parameters."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in VALUE_FILLS and name != "copy_" and args and isinstance(args[0], torch.nn.Parameter):
            self.count += 1
        return func(*args, **(kwargs or {}))


# one small model per kind of construction-time buffer: none (ViT), RoPE tables (EVA02, PE), Swin's masks
WEIGHT_FILE_MODELS = {
    "vit": ("vit_small_patch16_224", dict(depth=1), 224),
    "eva02": ("eva02_tiny_patch14_224", dict(depth=2, img_size=56), 56),
    "pe": ("vit_pe_core_small_patch16_384", dict(depth=2, img_size=64), 64),
    "swin": ("swinv2_tiny_window8_256", dict(img_size=64, embed_dim=24, depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4),
                                             window_size=4), 64),
}


@pytest.mark.parametrize("kind", list(WEIGHT_FILE_MODELS))
def test_a_weight_file_is_loaded_without_initialising_what_it_replaces(kind, tmp_path):
    """Every parameter comes from the file (a missing key is an error), so timm's random init of them is skipped;
    the buffers timm computes at construction are built, and the model equals the one the file was saved from."""
    from interp.models.fingerprint import weights_fingerprint

    name, kwargs, size = WEIGHT_FILE_MODELS[kind]
    saved = interp.load(name, pretrained=False, seed=3, **kwargs)
    torch.save(saved.timm_model.state_dict(), tmp_path / "w.pth")
    with _ParameterFills() as random_fills:
        interp.load(name, pretrained=False, **kwargs)
    with _ParameterFills() as file_fills:
        loaded = interp.load(name, weights=tmp_path / "w.pth", **kwargs)
    assert random_fills.count > 5 and file_fills.count == 0
    assert weights_fingerprint(loaded) == weights_fingerprint(saved) and loaded.init_seed is None
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), saved(x), atol=1e-5, rtol=0)  # the weights: equal fingerprints


def test_cli_seed_gives_the_same_model_in_every_run_and_is_recorded(tmp_path):
    from interp.cli import main

    img = tmp_path / "imgs"
    img.mkdir()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(img / "a.png")
    prints = []
    for run, seed in (("r1", "0"), ("r2", "0")):
        assert main(["study", "norms", "vit_small_patch16_224", "--no-pretrained", "--depth", "1", "--seed", seed,
                     "--images", str(img), "--out", str(tmp_path / run), "--quiet", "--no-progress"]) == 0
        data = json.loads((tmp_path / run / "norms.json").read_text())
        prints.append((data["fingerprint"], data["weights_seed"]))
    assert prints[0] == prints[1] and prints[0][1] == 0


# ------------------------------------------------------------------------------------------ weight files
def _save_state(model, path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.timm_model.state_dict().items()}, str(path))
    return path


@pytest.mark.parametrize("content,reason", [(b"", "empty"), (b"hello, I am text\n", "UnpicklingError|Error")])
def test_empty_or_text_pth_gives_the_reason(tmp_path, content, reason):
    path = tmp_path / "bad.pth"
    path.write_bytes(content)
    with pytest.raises(interp.errors.ModelLoadError, match=rf"bad\.pth.*bytes\): .*({reason})"):
        interp.load("vit_small_patch16_224", weights=path, depth=1)


def test_nan_weights_are_named_on_load(tmp_path):
    model = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    with torch.no_grad():
        model.timm_model.blocks[0].mlp.fc1.weight[0, 0] = float("nan")
        model.timm_model.head.bias[3] = float("inf")
        model.timm_model.blocks[0].norm1.bias[5] = -float("inf")
    path = _save_state(model, tmp_path / "nan.safetensors")
    with pytest.raises(interp.errors.ModelLoadError, match=r"NaN or infinite values in 3 tensor\(s\): blocks\.0\."
                                                            r"norm1\.bias, blocks\.0\.mlp\.fc1\.weight, head\.bias"):
        interp.load("vit_small_patch16_224", weights=path, depth=1)


def test_pos_embed_of_a_huge_grid_is_refused(tmp_path):
    model = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    sd = {k: v.contiguous() for k, v in model.timm_model.state_dict().items()}
    sd["pos_embed"] = torch.zeros(1, 1 + 300 * 300, sd["pos_embed"].shape[-1])
    from safetensors.torch import save_file

    save_file(sd, str(tmp_path / "big.safetensors"))
    with pytest.raises(interp.errors.ModelLoadError, match=r"300x300 position grid \(4800 px.*--img-size"):
        interp.load("vit_small_patch16_224", weights=tmp_path / "big.safetensors", depth=1)


def test_a_register_count_the_architecture_cannot_take_is_refused_in_one_line(tmp_path):
    """A file's register count rebuilds the model (tests/models/weights/test_finetuned_files.py) unless the call fixed
    the count, or the class takes none; then one line names the timm architecture that fits."""
    reg = interp.load("vit_small_patch14_reg4_dinov2", pretrained=False, depth=1, img_size=224)
    reg_file = _save_state(reg, tmp_path / "r.safetensors")
    with pytest.raises(interp.errors.ModelLoadError,
                       match=r"holds 4 register tokens but 'vit_small_patch14_dinov2' has none and reg_tokens=0 was "
                             r"asked for: load it into 'vit_small_patch14_reg4_dinov2'$"):
        interp.load("vit_small_patch14_dinov2", weights=reg_file, depth=1, img_size=224, reg_tokens=0)
    with pytest.raises(interp.errors.ModelLoadError,
                       match=r"holds 4 register tokens but 'swinv2_tiny_window8_256' has none and SwinTransformerV2 "
                             r"takes no register count: load it into an architecture with 4 register tokens$"):
        interp.load("swinv2_tiny_window8_256", weights=reg_file, embed_dim=32, depths=(1, 1, 1, 1))


def test_position_grid_warning_once_and_says_how_to_silence_it(tmp_path):
    small = interp.load("vit_small_patch14_dinov2", pretrained=False, depth=1, img_size=224)
    path = _save_state(small, tmp_path / "dino224.safetensors")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            interp.load("vit_small_patch14_dinov2", weights=path, depth=1)
    grid = [str(w.message) for w in caught if "position grid" in str(w.message)]
    assert len(grid) == 1 and "--img-size 224" in grid[0] and "without this warning" in grid[0]


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_a_file_of_integer_weights_is_refused_naming_the_keys(tmp_path, dtype):
    """Issue 53: an int64 weight file loaded, its values cast silently into the float model."""
    model = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    sd = {k: (v * 10).to(dtype).contiguous() for k, v in model.timm_model.state_dict().items()}
    torch.save(sd, tmp_path / "ints.pth")
    with pytest.raises(interp.errors.ModelLoadError, match=rf"holds {dtype} values where the model has float "
                                                            r"weights \(\d+ tensor\(s\): cls_token, pos_embed"):
        interp.load("vit_small_patch16_224", weights=tmp_path / "ints.pth", depth=1)
