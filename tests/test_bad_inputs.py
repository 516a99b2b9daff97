"""The crafted-input battery: every bad image, weight file, neuron set, patch spec and box/mask file a user may
hand interp either decodes right (pixel statistics checked) or is refused with one clear error line."""
from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import interp
from interp.errors import ImageError, ImageTooLargeError, InterpError
from interp.models.preprocessing import check_decodes, open_image, readable_images

from conftest import make_model


# ------------------------------------------------------------------------------------------ images: modes
def _gradient(dtype, high):
    """A 32x32 horizontal gradient 0..high (left to right) of ``dtype``."""
    return np.tile(np.linspace(0, high, 32), (32, 1)).astype(dtype)


def _mode_image(mode: str) -> Image.Image:
    if mode == "I;16":
        return Image.fromarray(_gradient(np.uint16, 65535))
    if mode == "I":
        return Image.fromarray(_gradient(np.int32, 65535))
    if mode == "I-int32-wide":  # int32 TIFF with a range beyond 16 bit: min-max scaled
        return Image.fromarray(_gradient(np.int32, 1_000_000) - 500_000)
    if mode == "F":
        return Image.fromarray(_gradient(np.float32, 1.0))
    if mode == "F-wide":
        return Image.fromarray(_gradient(np.float32, 4000.0))
    gray = Image.fromarray(_gradient(np.uint8, 255))
    if mode == "1":
        return gray.convert("1", dither=Image.Dither.NONE)
    if mode in ("P", "L", "CMYK"):
        return gray.convert(mode)
    if mode == "LA":
        return Image.merge("LA", [gray, Image.new("L", gray.size, 255)])
    if mode == "RGBA":
        return Image.merge("RGBA", [gray, gray, gray, Image.new("L", gray.size, 255)])
    raise AssertionError(mode)


MODES = {  # mode -> (file suffix, expected mean of the decoded 0..255 image, tolerance)
    "I;16": (".png", 127.5, 2.0), "I": (".tif", 127.5, 2.0), "I-int32-wide": (".tif", 127.5, 2.0),
    "F": (".tif", 127.5, 2.0), "F-wide": (".tif", 127.5, 2.0), "P": (".png", 127.5, 3.0),
    "LA": (".png", 127.5, 2.0), "RGBA": (".png", 127.5, 2.0), "L": (".png", 127.5, 2.0),
    "1": (".png", 127.5, 10.0), "CMYK": (".tif", 127.5, 2.0),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_every_pil_mode_decodes_to_its_gradient(tmp_path, mode):
    suffix, mean, tol = MODES[mode]
    path = tmp_path / f"img{suffix}"
    _mode_image(mode).save(path)
    rgb = np.asarray(open_image(path), dtype=np.float64)
    assert rgb.shape == (32, 32, 3)
    assert abs(rgb.mean() - mean) < tol, (mode, Image.open(path).mode, rgb.mean())
    assert rgb.std() > 60  # a gradient, not a blank (white or black) image
    assert rgb[:, :4].mean() < 40 and rgb[:, -4:].mean() > 215  # dark left, bright right
    if mode != "1":  # a gradient through the middle, not a clipped step from black to white
        assert 90 < rgb[:, 12:20].mean() < 165 and rgb[:, 12:20].std() < 40, (mode, rgb[0, 12:20, 0])


def test_sixteen_bit_png_is_not_blank_white(tmp_path):
    path = tmp_path / "depth16.png"
    Image.fromarray(_gradient(np.uint16, 65535)).save(path)
    assert Image.open(path).mode == "I;16"
    assert np.asarray(Image.open(path).convert("RGB")).std() < 60  # what PIL's own convert gives
    assert np.asarray(open_image(path)).std() > 60


def test_transparent_pixels_composite_on_white(tmp_path):
    path = tmp_path / "clear.png"
    Image.new("RGBA", (8, 8), (0, 0, 0, 0)).save(path)
    assert np.asarray(open_image(path)).min() == 255


# ------------------------------------------------------------------------------------------ images: broken
def _truncated_jpeg(path: Path) -> Path:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8)).save(buf, format="JPEG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    return path


def _bomb_png(path: Path) -> Path:
    """A 30000x30000 PNG in about 1 MB (header says 9e8 pixels: over PIL's decompression-bomb limit)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    side = 30000
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit gray
    row = b"\x00" + b"\x00" * (side // 8)
    data = zlib.compress(row * 200, 9)  # only part of the rows: the header alone trips the check
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def test_truncated_jpeg_is_found_up_front_and_skipped(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (16, 16), (10, 20, 30)).save(good)
    bad = _truncated_jpeg(tmp_path / "cut.jpg")
    with Image.open(bad) as im:
        im.verify()  # the header alone looks fine: that is why a header check kept it before
    skipped = []
    with pytest.warns(UserWarning, match="skipped unreadable image"):
        assert readable_images([bad, good], skipped=skipped) == [good]
    assert skipped[0][0] == str(bad) and "truncated" in skipped[0][1]
    with pytest.raises(ImageError, match="strict"):
        readable_images([bad, good], strict=True)


def test_truncated_jpeg_does_not_stop_a_live_study(tmp_path):
    from interp.studies.artifacts.norms import norms_study
    from interp.runtime.open import open_source

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (32, 32), (40 * i, 90, 200)).save(folder / f"ok{i}.png")
    _truncated_jpeg(folder / "cut.jpg")
    model = make_model("vit")
    with pytest.warns(UserWarning, match="skipped unreadable image"):
        source = open_source(model=model, images=folder)
    assert len(source) == 2 and [Path(p).name for p, _ in source.skipped] == ["cut.jpg"]
    result = norms_study(source, progress=False)
    assert result is not None
    with pytest.raises(ImageError):
        open_source(model=model, images=folder, strict=True)


def test_decompression_bomb_is_one_catchable_image_error(tmp_path):
    bomb = _bomb_png(tmp_path / "bomb.png")
    for call in (open_image, check_decodes):
        with pytest.raises(ImageTooLargeError, match="too large to decode safely") as info:
            call(bomb)
        assert isinstance(info.value, ImageError)  # skip-and-record code catches ImageError
    skipped = []
    good = tmp_path / "good.png"
    Image.new("RGB", (8, 8)).save(good)
    with pytest.warns(UserWarning):
        assert readable_images([bomb, good], skipped=skipped) == [good]
    assert "too large" in skipped[0][1]


@pytest.mark.parametrize("content", [b"", b"not an image at all\n", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20])
def test_unreadable_image_files_name_the_file(tmp_path, content):
    path = tmp_path / "broken.png"
    path.write_bytes(content)
    for call in (open_image, check_decodes):
        with pytest.raises(ImageError, match="broken.png"):
            call(path)


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
    path = _save_state(model, tmp_path / "nan.safetensors")
    with pytest.raises(interp.errors.ModelLoadError, match=r"NaN or infinite values in 2 tensor\(s\): "
                                                            r"blocks\.0\.mlp\.fc1\.weight, head\.bias"):
        interp.load("vit_small_patch16_224", weights=path, depth=1)


def test_pos_embed_of_a_huge_grid_is_refused(tmp_path):
    model = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    sd = {k: v.contiguous() for k, v in model.timm_model.state_dict().items()}
    sd["pos_embed"] = torch.zeros(1, 1 + 300 * 300, sd["pos_embed"].shape[-1])
    from safetensors.torch import save_file

    save_file(sd, str(tmp_path / "big.safetensors"))
    with pytest.raises(interp.errors.ModelLoadError, match=r"300x300 position grid \(4800 px.*--img-size"):
        interp.load("vit_small_patch16_224", weights=tmp_path / "big.safetensors", depth=1)


def test_register_mismatch_names_the_architecture_that_fits(tmp_path):
    plain = interp.load("vit_small_patch14_dinov2", pretrained=False, depth=1, img_size=224)
    reg = interp.load("vit_small_patch14_reg4_dinov2", pretrained=False, depth=1, img_size=224)
    plain_file, reg_file = _save_state(plain, tmp_path / "plain.safetensors"), _save_state(reg, tmp_path / "r.safetensors")
    with pytest.raises(interp.errors.ModelLoadError,
                       match=r"holds no register tokens but 'vit_small_patch14_reg4_dinov2' has 4: load it into "
                             r"'vit_small_patch14_dinov2'"):
        interp.load("vit_small_patch14_reg4_dinov2", weights=plain_file, depth=1, img_size=224)
    with pytest.raises(interp.errors.ModelLoadError,
                       match=r"holds 4 register tokens but 'vit_small_patch14_dinov2' has none: load it into "
                             r"'vit_small_patch14_reg4_dinov2'"):
        interp.load("vit_small_patch14_dinov2", weights=reg_file, depth=1, img_size=224)


def test_position_grid_warning_once_and_says_how_to_silence_it(tmp_path):
    small = interp.load("vit_small_patch14_dinov2", pretrained=False, depth=1, img_size=224)
    path = _save_state(small, tmp_path / "dino224.safetensors")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            interp.load("vit_small_patch14_dinov2", weights=path, depth=1)
    grid = [str(w.message) for w in caught if "position grid" in str(w.message)]
    assert len(grid) == 1 and "--img-size 224" in grid[0] and "without this warning" in grid[0]


# ------------------------------------------------------------------------------------------ neuron sets
def _neurons_json(path, model, entries=((0, 3), (0, 7), (1, 2))):
    from interp.models.fingerprint import weights_fingerprint

    path.write_text(json.dumps({"study": "neurons", "model": model.model_name,
                                "fingerprint": weights_fingerprint(model), "params": {}, "seed": 0,
                                "neurons": [{"layer": l, "neuron": n, "score": 1.0} for l, n in entries]}))
    return path


def test_interventions_take_every_neuron_form(tmp_path):
    from interp.interventions import NeuronAblation, Relocation, TestTimeRegister
    from interp.studies.artifacts.neurons import NeuronsResult

    model = make_model("vit")
    path = _neurons_json(tmp_path / "neurons.json", model)
    result = NeuronsResult.from_json(path)
    want = {0: [3, 7], 1: [2]}
    x = torch.randn(1, 3, 224, 224)
    for form in (want, "0:3,0:7,1:2", str(path), path, result):
        for edit in (NeuronAblation(form), TestTimeRegister(form), Relocation(form, target=torch.ones(14, 14))):
            assert edit.neurons == want, (form, type(edit).__name__)
        with model.intervene(NeuronAblation(form)):
            model(x)


def test_neurons_ranked_on_another_model_are_refused_unless_forced(tmp_path):
    from interp.interventions import NeuronAblation, TestTimeRegister

    other = make_model("vit", seed=1)
    model = make_model("vit")
    path = _neurons_json(tmp_path / "neurons.json", other)
    x = torch.randn(1, 3, 224, 224)
    for edit in (NeuronAblation(path), TestTimeRegister(str(path))):
        with pytest.raises(InterpError, match=r"ranked on vit_small_patch16_224 \(weights \w+\), not on this "
                                              r"vit_small_patch16_224 \(weights \w+\).*force=True"):
            with model.intervene(edit):
                model(x)
    with model.intervene(NeuronAblation(path, force=True)):
        model(x)
    with other.intervene(NeuronAblation(path)):  # the model it was ranked on
        other(x)


BAD_NEURONS = [("", "empty"), ("2:x", "cannot read '2:x'"), ("2:17,2:17", "listed twice"), (3.5, "float"),
               ("missing.json", "does not exist")]


@pytest.mark.parametrize("form,message", BAD_NEURONS)
def test_bad_neuron_forms_are_one_line(form, message):
    from interp.interventions import NeuronAblation

    with pytest.raises(InterpError, match=message):
        NeuronAblation(form)


@pytest.mark.parametrize("content,message", [("{", "cannot read neurons file"), ('{"a": 1}', "not a neurons study"),
                                             ('{"neurons": []}', "ranks no neurons"),
                                             ('{"neurons": [{"layer": true, "neuron": 1}]}', "integers"),
                                             ('{"neurons": [1, 2]}', "not a neurons study")])
def test_bad_neurons_json_is_one_line(tmp_path, content, message):
    from interp.interventions import TestTimeRegister

    path = tmp_path / "n.json"
    path.write_text(content)
    with pytest.raises(InterpError, match=message):
        TestTimeRegister(path)


@pytest.mark.parametrize("n", [20000, 50000, 10**7])
def test_too_many_test_time_registers_are_refused_at_once(n):
    from interp.interventions import TestTimeRegister

    with pytest.raises(InterpError, match=rf"n_registers={n} is more than 1024.*MAX_REGISTERS"):
        TestTimeRegister({0: [1]}, n_registers=n)


def test_cli_refuses_foreign_neurons_json_in_one_line(tmp_path, capsys):
    from interp.cli import main

    img = tmp_path / "imgs"
    img.mkdir()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(img / "a.png")
    other = interp.load("vit_small_patch16_224", pretrained=False, depth=1, seed=7)
    path = _neurons_json(tmp_path / "neurons.json", other, entries=((0, 3),))
    args = ["study", "ablate", "vit_small_patch16_224", "--no-pretrained", "--depth", "1", "--images", str(img),
            "--neurons", str(path), "--controls", "1", "--no-progress"]
    assert main(args + ["--out", str(tmp_path / "o1")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ranked on" in err[0] and "--force" in err[0] and "Traceback" not in err[0]
    assert main(args + ["--out", str(tmp_path / "o2"), "--force", "--quiet"]) == 0


# ------------------------------------------------------------------------------------------ hooks
def test_hook_returning_the_wrong_shape_names_hook_and_shape():
    from interp.errors import HookShapeError

    model = make_model("vit")

    def first_ten(act, hook):
        return act[..., :10]

    with pytest.raises(HookShapeError, match=r"'first_ten' on blocks\.1\.mlp\.hook_post returned shape "
                                             r"\[1, 197, 10\], but blocks\.1\.mlp\.hook_post carries \[1, 197, 1536\]"):
        model.run_with_hooks(torch.randn(1, 3, 224, 224), fwd_hooks=[("blocks.1.mlp.hook_post", first_ten)])
    with pytest.raises(HookShapeError):
        with model.hooks(fwd_hooks=[("blocks.*.hook_resid_post", lambda a, hook: a[:, :5])]):
            model(torch.randn(1, 3, 224, 224))
    model.run_with_hooks(torch.randn(1, 3, 224, 224), fwd_hooks=[("blocks.1.mlp.hook_post", lambda a, hook: None)])


def test_block_out_of_range_states_the_valid_range():
    from interp.errors import HookNameError

    model = make_model("vit")  # 2 blocks
    with pytest.raises(HookNameError, match=r"block 12 does not exist, this model has 2 blocks \(0-1\)"):
        model.run_with_hooks(torch.randn(1, 3, 224, 224), fwd_hooks=[("blocks.12.hook_resid_post", print)])


def test_transformer_lens_style_cache_keys():
    from interp.errors import HookNameError

    model = make_model("vit")
    _, cache = model.run_with_cache(torch.randn(1, 3, 224, 224))
    assert torch.equal(cache["resid_post", 1], cache["blocks.1.hook_resid_post"])
    assert torch.equal(cache["q", -1], cache["blocks.1.attn.hook_q"])
    assert torch.equal(cache["post", 0], cache["blocks.0.mlp.hook_post"])
    assert torch.equal(cache["pattern", 0], cache["blocks.0.attn.hook_pattern"])
    assert torch.equal(cache["embed",], cache["hook_embed"])
    for key, message in ((("resid_post", 5), r"block 5 does not exist.*2 blocks"), (("resid_pots", 1), "resid_post"),
                         (("resid_post",), "give its block")):
        with pytest.raises(HookNameError, match=message):
            cache[key]


# ------------------------------------------------------------------------------------------ patch files and specs
def _crafted_patch(tmp_path, edit_spec=None, drop_tensors=False, name="crafted.safetensors"):
    """A valid patch of a NeuronAblation(mean) + TestTimeRegister, its spec changed by ``edit_spec(spec)``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from interp.interventions import NeuronAblation, TestTimeRegister
    from interp.interventions import export

    model = make_model("vit")
    means = {0: torch.tensor([0.5, 0.25])}
    path = export.save([NeuronAblation({0: [1, 2]}, mode="mean", means=means), TestTimeRegister({1: [3]})],
                       tmp_path / "ok.safetensors", model)
    with safe_open(str(path), framework="pt") as f:
        spec = json.loads(f.metadata()[export.METADATA_KEY])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if drop_tensors:
        tensors = {}
        spec["tensor_sha256"] = export._tensor_digest(tensors)
    if edit_spec is not None:
        spec = edit_spec(spec) or spec
    text = spec if isinstance(spec, str) else json.dumps(spec)
    out = tmp_path / name
    save_file(tensors, str(out), metadata={export.METADATA_KEY: text})
    return out


def _set(key, value):
    def edit(spec):
        spec[key] = value
    return edit


def _set_param(index, key, value):
    def edit(spec):
        spec["interventions"][index]["params"][key] = value
    return edit


PATCH_CASES = {
    "deeply nested JSON": (lambda spec: "[" * 100000 + "]" * 100000, "nested too deeply"),
    "interventions int": (_set("interventions", 3), "is a int, not a list"),
    "interventions null": (_set("interventions", None), "is a NoneType, not a list"),
    "interventions strings": (_set("interventions", ["a", "b"]), "entry 0 .* is not an object"),
    "version abc": (_set("version", "abc"), "version is 'abc', not a whole number"),
    "version null": (_set("version", None), "version is None, not a whole number"),
    "n_registers 50000": (_set_param(1, "n_registers", 50000), "n_registers=50000 is more than 1024"),
    "n_registers 1e7": (_set_param(1, "n_registers", 10**7), "n_registers=10000000 is more than 1024"),
    "n_registers text": (_set_param(1, "n_registers", "many"), "whole number"),
    "neurons list": (_set_param(1, "neurons", [1, 2]), "invalid TestTimeRegister entry 1"),
}


@pytest.mark.parametrize("case", list(PATCH_CASES))
def test_crafted_patch_specs_are_one_patch_error(tmp_path, case):
    from interp.errors import PatchError
    from interp.interventions import export

    edit, message = PATCH_CASES[case]
    path = _crafted_patch(tmp_path, edit)
    with pytest.raises(PatchError, match=message) as info:
        export.load(path)
    assert "\n" not in str(info.value)


def test_patch_missing_a_tensor_is_named(tmp_path):
    from interp.errors import PatchError
    from interp.interventions import export

    with pytest.raises(PatchError, match=r"entry 0 \(NeuronAblation\) needs tensor\(s\) \['0.means.0'\]"):
        export.load(_crafted_patch(tmp_path, drop_tensors=True))


@pytest.mark.parametrize("content,message", [
    ("[" * 100000 + "]" * 100000, "nested too deeply"), (b"\xff\xfe\x00bad", "UnicodeDecodeError"),
    ('[{"kind": ["x"]}]', "unknown intervention kind"), ('[{"kind": "TestTimeRegister", "neurons": {"0": [1]}, '
                                                          '"n_registers": 20000}]', "more than 1024"),
    ("3", "list of objects")])
def test_crafted_intervention_spec_files(tmp_path, content, message):
    from interp.interventions import interventions_from_spec

    path = tmp_path / "spec.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InterpError, match=message):
        interventions_from_spec(path)


# ------------------------------------------------------------------------------------------ box and mask files
CSV_HEAD = "image,x0,y0,x1,y1,width,height\n"
BOX_FILE_CASES = {  # name -> (file name, content, message)
    "non-UTF-8 CSV": ("b.csv", (CSV_HEAD + "caf\xe9.jpg,0,0,10,10,20,20\n").encode("latin-1"), "not UTF-8 text"),
    "text width": ("b.csv", CSV_HEAD + "a.jpg,0,0,10,10,wide,20\n", "line 2: width must be a number, got 'wide'"),
    "NaN width": ("b.csv", CSV_HEAD + "a.jpg,0,0,10,10,nan,20\n", "width must be a finite number"),
    "width 0": ("b.csv", CSV_HEAD + "a.jpg,0,0,10,10,0,20\n", "whole pixel counts >= 1"),
    "huge size": ("b.csv", CSV_HEAD + "a.jpg,0,0,10,10,200000,200000\n", "more than 100,000,000"),
    "inf box": ("b.csv", CSV_HEAD + "a.jpg,0,0,inf,10,20,20\n", "x1 must be a finite number"),
    "1e308 box": ("b.csv", CSV_HEAD + "a.jpg,0,0,1e308,10,20,20\n", "reaches far outside its 20 x 20 image"),
    "off-image box": ("b.csv", CSV_HEAD + "a.jpg,30,30,40,40,20,20\n", "lies outside its 20 x 20 image"),
    "zero-size box": ("b.csv", CSV_HEAD + "a.jpg,5,5,5,10,20,20\n", "x1 > x0 and y1 > y0"),
    "negative box": ("b.csv", CSV_HEAD + "a.jpg,9,5,3,10,20,20\n", "x1 > x0 and y1 > y0"),
    "missing column": ("b.csv", "image,x0,y0,x1\na.jpg,0,0,1\n", r"missing \['y1'\]"),
    "boolean coordinate": ("b.json", json.dumps([{"image": "a.jpg", "x0": True, "y0": 0, "x1": 5, "y1": 5}]),
                           "x0 must be a number, got the boolean True"),
    "JSON not a list": ("b.json", json.dumps({"boxes": 3}), "expected a list of box records"),
    "nested JSON": ("b.json", "[" * 100000 + "]" * 100000, "nested too deeply"),
    "COCO no bbox": ("c.json", json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}],
                                           "annotations": [{"image_id": 1}]}), r"'bbox' must be \[x, y, width"),
    "COCO 3-number bbox": ("c.json", json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}],
                                                 "annotations": [{"image_id": 1, "bbox": [1, 2, 3]}]}),
                           r"'bbox' must be \[x, y, width, height\], got \[1, 2, 3\]"),
    "COCO no file_name": ("c.json", json.dumps({"images": [{"id": 1}], "annotations": []}),
                          r"images\[0\] needs 'id' and 'file_name'"),
    "COCO annotations null": ("c.json", json.dumps({"images": [], "annotations": None}),
                              "'annotations' must be a list"),
    "COCO images null": ("c.json", json.dumps({"images": None, "annotations": []}), "'images' must be a list"),
    "COCO text width": ("c.json", json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "width": "x",
                                                          "height": 4}], "annotations": []}), "width must be a number"),
}


@pytest.mark.parametrize("case", list(BOX_FILE_CASES))
def test_bad_box_files_are_one_line_naming_the_record(tmp_path, case):
    from interp.formats.box_files import read_boxes

    name, content, message = BOX_FILE_CASES[case]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InterpError, match=message) as info:
        read_boxes(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_utf8_bom_csv_reads_its_image_column(tmp_path):
    from interp.formats.box_files import read_boxes

    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (CSV_HEAD + "a.jpg,1,2,5,6,20,20\n").encode())
    table = read_boxes(path)
    assert table["a.jpg"].boxes[0].as_list() == [1, 2, 5, 6] and table["a.jpg"].size == (20, 20)


DATA_CFG = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3,
            "crop_pct": 0.875, "crop_mode": "center"}


@pytest.mark.parametrize("fraction", [-1, 0, float("nan"), 1.5, True])
def test_max_box_fraction_outside_zero_one_is_refused(fraction):
    from interp.formats.box_types import ImageBoxes
    from interp.studies.core.regions import regions_from_boxes

    with pytest.raises(InterpError, match="max_box_fraction=.*give a share of the image area in"):
        regions_from_boxes(["a.jpg"], {"a.jpg": ImageBoxes(size=(20, 20))}, DATA_CFG, (14, 14),
                           max_box_fraction=fraction)


def test_box_outside_the_image_read_from_its_file_is_refused(tmp_path):
    from interp.formats.box_files import read_boxes
    from interp.studies.core.regions import regions_from_boxes

    Image.new("RGB", (40, 30)).save(tmp_path / "a.png")
    (tmp_path / "b.csv").write_text("image,x0,y0,x1,y1\na.png,50,5,60,10\n")  # no size: read from the image
    with pytest.raises(InterpError, match=r"box \[50.0, 5.0, 60.0, 10.0\] lies outside its 40 x 30 image"):
        regions_from_boxes([str(tmp_path / "a.png")], read_boxes(tmp_path / "b.csv"), DATA_CFG, (14, 14))


@pytest.mark.parametrize("content,message", [(b"just text", "cannot read mask"), (None, "cannot read mask")])
def test_text_or_truncated_mask_png(tmp_path, content, message):
    from interp.formats.masks import read_mask

    path = tmp_path / "m.png"
    if content is None:  # a truncated PNG: header fine, pixels cut
        rng = np.random.default_rng(0)
        Image.fromarray((rng.random((64, 64)) > 0.5).astype(np.uint8) * 255).save(path)
        path.write_bytes(path.read_bytes()[:120])
    else:
        path.write_bytes(content)
    with pytest.raises(InterpError, match=message):
        read_mask(path)


@pytest.mark.parametrize("images,anns,message", [
    ([{"id": 1, "file_name": "a.jpg", "width": 200000, "height": 200000}], [], "more than 100,000,000"),
    ([{"id": 1, "file_name": "a.jpg"}], [], r"needs 'width' and 'height'"),
    ([{"id": 1, "file_name": "a.jpg", "width": 4, "height": 4}], None, "'annotations' must be a list"),
    ([{"id": 1, "file_name": "a.jpg", "width": 4, "height": 4}],
     [{"image_id": 1, "segmentation": [[0, 0, "x", 1, 2, 2]]}], "list of polygons"),
])
def test_bad_coco_mask_json(tmp_path, images, anns, message):
    from interp.studies.objects.segment import read_coco_polygons

    path = tmp_path / "masks.json"
    path.write_text(json.dumps({"images": images, "annotations": anns}))
    with pytest.raises(InterpError, match=message):
        read_coco_polygons(path)


# ------------------------------------------------------------------------------------------ through the CLI
def _one_error_line(err: str) -> str:
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("interp: error: ") and "Traceback" not in err, err
    return lines[0]


def test_cli_crafted_patch_is_one_line_without_traceback(tmp_path, capsys):
    from interp.cli import main

    path = _crafted_patch(tmp_path, _set("interventions", None))
    assert main(["patch", "show", str(path)]) != 0  # a traceback would raise here
    assert "not a list" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("box_line,message", [("a.png,0,0,inf,10,32,32", "finite"),
                                              ("a.png,40,40,50,50,32,32", "outside")])
def test_cli_study_with_a_bad_box_file(tmp_path, capsys, box_line, message):
    from interp.cli import main

    img = tmp_path / "imgs"
    img.mkdir()
    Image.new("RGB", (32, 32), (10, 200, 30)).save(img / "a.png")
    (tmp_path / "boxes.csv").write_text(CSV_HEAD + box_line + "\n")
    rc = main(["study", "pib", "vit_small_patch16_224", "--no-pretrained", "--depth", "1", "--images", str(img),
               "--boxes", str(tmp_path / "boxes.csv"), "--out", str(tmp_path / "out"), "--no-progress"])
    assert rc != 0
    assert message in _one_error_line(capsys.readouterr().err)


def test_cache_skips_a_decompression_bomb_and_its_reader_takes_tensor_lens_keys(tmp_path):
    import interp.cache

    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.new("RGB", (32, 32), (10, 200, 30)).save(folder / "a.png")
    _bomb_png(folder / "bomb.png")
    model = make_model("vit")
    with pytest.warns(UserWarning, match="too large to decode safely"):
        interp.cache.write(model, folder, hooks="blocks.*.hook_resid_post", path=tmp_path / "acts.h5",
                           progress=False)
    with interp.cache.open(tmp_path / "acts.h5") as reader:
        assert [Path(i).name for i in reader.ids] == ["a.png"]
        acts = reader.activation_cache([0])
        assert torch.equal(acts["resid_post", 1], acts["blocks.1.hook_resid_post"])
