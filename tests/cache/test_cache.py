"""interp.cache: round trips against run_with_cache, file format, reader API, errors, CLI."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import interp
import interp.cache
from conftest import images, make_model
from interp.cache.lock import WriterLock
from interp.errors import CacheError, ImageError

HOOKS = ["blocks.*.hook_resid_post", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_q", "hook_pooled"]
VECTOR_HOOKS = ["blocks.0.hook_resid_post", "blocks.1.mlp.hook_post", "blocks.1.attn.hook_z", "hook_pooled"]


def write_images(folder: Path, n: int, corrupt_at=(), size=(40, 48), seed: int = 0) -> Path:
    """n small random images (PNG and JPEG alternately) named in order, plus garbage files at ``corrupt_at``."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        name = folder / f"img{i:03d}"
        if i in corrupt_at:
            name.with_suffix(".png").write_bytes(b"not an image \x00\xff" * 16)
            continue
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(name.with_suffix(".jpg" if i % 2 else ".png"))
    return folder


def expected_hooks(model, x, hooks, tokens="all", norms_only=False, batch_size=None):
    """What the cache should hold for each of ``hooks`` (hook -> tensor), computed straight from run_with_cache
    over the same batches with the same hooks attached (hooking an attention pattern switches that block from
    the fused attention kernel to the explicit softmax, which rounds differently)."""
    batch_size = batch_size or len(x)
    with torch.no_grad():
        parts = [model.run_with_cache(x[i:i + batch_size], names_filter=hooks)[1] for i in range(0, len(x), batch_size)]
    lay = model.layout
    rows = {"all": slice(None), "prefix": slice(0, lay.n_prefix), "patches": slice(lay.n_prefix, None),
            "cls": slice(lay.cls_index, lay.cls_index + 1)}[tokens]
    out = {}  # hook -> [N, ...] the rows kept
    for hook in parts[0].keys():
        act = torch.cat([part[hook] for part in parts])
        if hook.endswith(("hook_pattern", "hook_attn_scores")):
            act = act[:, :, rows]
        elif not hook.endswith(("hook_pooled", "hook_logits")):
            act = act[:, rows]
        if norms_only:
            act = act.flatten(2).norm(dim=-1) if act.ndim > 2 else act.norm(dim=-1)
        out[hook] = act
    return out


@pytest.fixture(scope="module")
def vit():
    return make_model("vit")


@pytest.fixture(scope="module")
def reg_vit():
    return make_model("dinov2_reg")


# ---------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("family", ["vit", "dinov2_reg"])
@pytest.mark.parametrize("tokens", ["all", "prefix", "patches", "cls"])
def test_round_trip_float32_is_exact(family, tokens, vit, reg_vit, tmp_path):
    model = vit if family == "vit" else reg_vit
    x = images(3)
    path = tmp_path / "acts.h5"
    summary = interp.cache.write(model, x, hooks=HOOKS, path=path, batch_size=2, dtype="float32", tokens=tokens,
                                 progress=False)
    assert summary.complete and summary.n_written == 3
    with interp.cache.open(path, model=model) as cache:
        assert cache.hooks == model.resolve_hooks(HOOKS)
        assert len(cache) == 3 and cache.ids == ["tensor:0", "tensor:1", "tensor:2"]
        assert cache.layout == model.layout
        wanted = expected_hooks(model, x, HOOKS, tokens, batch_size=2)
        for hook in cache.hooks:
            want = wanted[hook].numpy()
            got = cache[hook][:]
            assert got.dtype == np.float32 and got.shape == want.shape, hook
            np.testing.assert_array_equal(got, want, err_msg=hook)
    if family == "dinov2_reg" and tokens == "prefix":
        assert got.shape[0] == 3 and cache.layout.n_registers == 4


@pytest.mark.parametrize("tokens", ["all", "cls"])
def test_round_trip_float16_within_rounding(tokens, reg_vit, tmp_path):
    x = images(3)
    path = tmp_path / "acts.h5"
    interp.cache.write(reg_vit, x, hooks=HOOKS, path=path, batch_size=3, dtype="float16", tokens=tokens,
                       progress=False)
    with interp.cache.open(path) as cache:
        wanted = expected_hooks(reg_vit, x, HOOKS, tokens)
        for hook in cache.hooks:
            want = wanted[hook]
            got = cache[hook][:]
            assert got.dtype == np.float16
            np.testing.assert_array_equal(got, want.half().numpy(), err_msg=hook)  # one rounding, nothing else
            np.testing.assert_allclose(got.astype(np.float32), want.numpy(), rtol=1e-3, atol=1e-4, err_msg=hook)


@pytest.mark.parametrize("tokens", ["all", "patches"])
def test_norms_only_stores_token_norms(tokens, reg_vit, tmp_path):
    x = images(2)
    path = tmp_path / "norms.h5"
    interp.cache.write(reg_vit, x, hooks=VECTOR_HOOKS, path=path, dtype="float32", tokens=tokens, norms_only=True,
                       progress=False)
    with interp.cache.open(path) as cache:
        assert cache.meta["norms_only"] is True
        n_tokens = reg_vit.layout.n_tokens if tokens == "all" else reg_vit.layout.n_patches
        wanted = expected_hooks(reg_vit, x, VECTOR_HOOKS, tokens, norms_only=True)
        for hook in cache.hooks:
            got = cache[hook][:]
            want = wanted[hook].numpy()
            assert got.shape == ((2,) if hook == "hook_pooled" else (2, n_tokens)), hook
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=hook)


def test_norms_only_refuses_attention_maps(vit, tmp_path):
    with pytest.raises(CacheError, match="attention"):
        interp.cache.write(vit, images(1), hooks="blocks.0.attn.hook_pattern", path=tmp_path / "x.h5",
                           norms_only=True, progress=False)


def test_image_files_match_load_images_and_corrupt_file_is_skipped(vit, tmp_path):
    folder = write_images(tmp_path / "imgs", 5, corrupt_at=(2,))
    path = tmp_path / "acts.h5"
    with pytest.warns(UserWarning, match="img002.png"):
        summary = interp.cache.write(vit, folder, hooks="blocks.1.hook_resid_post", path=path, batch_size=2,
                                     dtype="float32", progress=False)
    assert summary.n_written == 4 and summary.n_skipped == 1 and summary.complete
    good = [p for p in sorted(folder.iterdir()) if p.stem != "img002"]
    x = interp.load_images(good, vit)
    with interp.cache.open(path) as cache:
        assert cache.ids == [str(p) for p in good]
        assert cache.index.tolist() == [0, 1, 3, 4]
        assert [s[:2] for s in cache.skipped] == [(2, str(folder / "img002.png"))]
        assert "cannot read image" in cache.skipped[0][2]
        want = expected_hooks(vit, x, ["blocks.1.hook_resid_post"], batch_size=2)["blocks.1.hook_resid_post"]
        np.testing.assert_array_equal(cache["blocks.1.hook_resid_post"][:], want.numpy())
    with h5py.File(path, "r") as h5:
        assert h5["skipped/path"].asstr()[0] == str(folder / "img002.png")


def test_strict_stops_at_corrupt_file_and_keeps_committed_rows(vit, tmp_path):
    folder = write_images(tmp_path / "imgs", 6, corrupt_at=(4,))
    path = tmp_path / "acts.h5"
    with pytest.raises(ImageError, match="img004.png"):
        interp.cache.write(vit, folder, hooks="blocks.0.hook_resid_post", path=path, batch_size=2, strict=True,
                           progress=False)
    with pytest.warns(UserWarning, match="incomplete"):
        cache = interp.cache.open(path)
    with cache:
        assert not cache.complete and len(cache) == 4 and cache["blocks.0.hook_resid_post"].shape[0] == 4
        assert cache.ids == [str(folder / f"img{i:03d}{'.jpg' if i % 2 else '.png'}") for i in range(4)]
    (folder / "img004.png").unlink()
    summary = interp.cache.write(vit, folder, hooks="blocks.0.hook_resid_post", path=path, batch_size=2,
                                 strict=True, progress=False, overwrite=True)
    assert summary.complete and summary.n_written == 5


# ---------------------------------------------------------------------------------------------- file format
def test_file_is_plain_hdf5_with_documented_layout(reg_vit, tmp_path):
    path = tmp_path / "acts.h5"
    interp.cache.write(reg_vit, images(5), hooks=HOOKS, path=path, batch_size=2, compression="lzf", progress=False)
    with h5py.File(path, "r") as h5:
        attrs = dict(h5.attrs)
        assert attrs["format_version"] == interp.cache.FORMAT_VERSION == 2
        assert attrs["model_depth"] == 2 == reg_vit.n_layers
        assert attrs["n_written"] == 5 and bool(attrs["complete"]) and attrs["dtype"] == "float16"
        assert attrs["weights_fingerprint"] == interp.models.weights_fingerprint(reg_vit.timm_model)
        assert attrs["model_name"] == "vit_small_patch14_reg4_dinov2"
        assert json.loads(attrs["layout"]) == reg_vit.layout.to_dict()
        assert json.loads(attrs["hooks"]) == reg_vit.resolve_hooks(HOOKS)
        assert json.loads(attrs["data_config"])["input_size"] == [3, 224, 224]
        for key in ("interp_version", "timm_version", "torch_version", "tokens", "norms_only"):
            assert key in attrs
        t = reg_vit.layout.n_tokens
        expected_shapes = {"blocks.0.hook_resid_post": (5, t, 384), "blocks.0.attn.hook_pattern": (5, 6, t, t),
                           "blocks.1.attn.hook_q": (5, t, 6, 64), "hook_pooled": (5, 384)}
        for hook, shape in expected_shapes.items():
            ds = h5[f"acts/{hook}"]
            assert ds.shape == shape and ds.dtype == np.float16
            assert ds.chunks == (2, *shape[1:]) and ds.maxshape == (None, *shape[1:])
            assert ds.compression == "lzf"
        assert h5["ids"].asstr()[:].tolist() == [f"tensor:{i}" for i in range(5)]
        assert h5["ids"].dtype.metadata["vlen"] is str
        assert h5["skipped/index"].shape == (0,)
        assert h5["checksums"].shape == (5, len(json.loads(attrs["hooks"])) + 1)
        assert h5["checksums"].dtype == np.uint32


def test_reader_api(reg_vit, tmp_path):
    x = images(5)
    path = tmp_path / "acts.h5"
    interp.cache.write(reg_vit, x, hooks=HOOKS, path=path, batch_size=2, dtype="float32", progress=False)
    hook = "blocks.1.hook_resid_post"
    want = expected_hooks(reg_vit, x, HOOKS, batch_size=2)[hook].numpy()
    with interp.cache.open(path) as cache:
        view = cache[hook]
        assert view.shape == want.shape and len(view) == 5
        np.testing.assert_array_equal(view[-1], want[-1])
        np.testing.assert_array_equal(view[[4, 0, 4]], want[[4, 0, 4]])
        np.testing.assert_array_equal(view[::2], want[::2])
        np.testing.assert_array_equal(view[1:3, :5], want[1:3, :5])
        t = cache.get(hook, 1, 4, torch=True)
        assert isinstance(t, torch.Tensor) and torch.equal(t, torch.from_numpy(want[1:4]))
        rows = []
        for idx, values in cache.batches(hook, batch_size=2):
            np.testing.assert_array_equal(values, want[idx])
            rows += idx.tolist()
        assert rows == [0, 1, 2, 3, 4]
        for idx, values in cache.batches("blocks.*", batch_size=3, torch=True):
            assert set(values) == {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
                                   "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_q"}
        acts = cache.activation_cache([3, 1])
        with torch.no_grad():
            _, live = reg_vit.run_with_cache(x[[3, 1]], names_filter=HOOKS)
        assert set(acts) == set(live)
        with pytest.raises(KeyError, match="blocks.1.hook_resid_post"):
            acts["blocks.1.hook_resid_pots"]  # a typo names the close stored hook
        wanted = expected_hooks(reg_vit, x, HOOKS, batch_size=2)
        for name, value in live.items():
            assert acts[name].shape == value.shape and acts[name].dtype == value.dtype, name
            want_rows = wanted[name][[3, 1]]
            assert torch.equal(acts[name], want_rows), name
        with pytest.raises(CacheError, match="blocks.1.hook_resid_post"):
            cache["blocks.1.hook_resid_pre"]
        with pytest.raises(IndexError):
            view[5]
    with pytest.raises(Exception):
        view[0]  # closed with the reader


# ---------------------------------------------------------------------------------------------- errors
def test_existing_file_is_never_overwritten_silently(vit, tmp_path):
    path = tmp_path / "acts.h5"
    interp.cache.write(vit, images(2), hooks="blocks.0.hook_resid_post", path=path, progress=False)
    before = path.read_bytes()
    with pytest.raises(CacheError, match="already exists.*--resume.*--overwrite"):
        interp.cache.write(vit, images(3), hooks="blocks.0.hook_resid_post", path=path, progress=False)
    assert path.read_bytes() == before
    summary = interp.cache.write(vit, images(2), hooks="blocks.0.hook_resid_post", path=path, resume=True,
                                 progress=False)
    assert summary.complete and summary.new_rows == 0 and summary.n_written == 2
    summary = interp.cache.write(vit, images(3), hooks="blocks.0.hook_resid_post", path=path, overwrite=True,
                                 progress=False)
    assert summary.n_written == 3


@pytest.mark.parametrize("change", ["hooks", "dtype", "tokens", "images", "weights"])
def test_resume_refuses_other_settings(change, vit, tmp_path):
    path = tmp_path / "acts.h5"
    settings = dict(hooks="blocks.0.hook_resid_post", dtype="float16", tokens="all")
    interp.cache.write(vit, images(2), path=path, progress=False, **settings)
    model, x = vit, images(2)
    if change == "hooks":
        settings["hooks"] = "blocks.1.hook_resid_post"
    elif change == "dtype":
        settings["dtype"] = "float32"
    elif change == "tokens":
        settings["tokens"] = "cls"
    elif change == "images":
        x = images(2, seed=1)
    else:
        model = make_model("vit", seed=1)
    with pytest.raises(CacheError, match=f"cannot resume.*{'images_sha256' if change == 'images' else change}"):
        interp.cache.write(model, x, path=path, resume=True, progress=False, **settings)


def test_second_writer_is_refused_and_stale_lock_is_ignored(vit, tmp_path):
    path = tmp_path / "acts.h5"
    with WriterLock(path):
        with pytest.raises(CacheError, match=r"being written by another process \(pid \d+"):
            interp.cache.write(vit, images(1), hooks="hook_embed", path=path, progress=False)
    assert not path.exists()
    # A lock file left by a dead writer (pid that cannot be running) does not block.
    (tmp_path / "acts.h5.lock").write_text("pid 999999999 on somewhere\n")
    assert interp.cache.write(vit, images(1), hooks="hook_embed", path=path, progress=False).complete
    assert not (tmp_path / "acts.h5.lock").exists()


def test_writer_failure_keeps_committed_batches(vit, tmp_path, monkeypatch):
    from interp.cache.store import CacheFile

    original = CacheFile.append
    calls = []

    def failing_append(self, batch):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        original(self, batch)

    monkeypatch.setattr(CacheFile, "append", failing_append)
    path = tmp_path / "acts.h5"
    with pytest.raises(CacheError, match="disk full"):
        interp.cache.write(vit, images(8), hooks="blocks.0.hook_resid_post", path=path, batch_size=2, progress=False)
    monkeypatch.setattr(CacheFile, "append", original)
    with pytest.warns(UserWarning, match="incomplete"):
        with interp.cache.open(path) as cache:
            assert len(cache) == 4
    summary = interp.cache.write(vit, images(8), hooks="blocks.0.hook_resid_post", path=path, batch_size=2,
                                 resume=True, progress=False)
    assert summary.complete and summary.new_rows == 4


def test_reader_refuses_other_model(vit, tmp_path):
    path = tmp_path / "acts.h5"
    interp.cache.write(vit, images(1), hooks="hook_embed", path=path, progress=False)
    interp.cache.open(path, model=vit).close()
    with pytest.raises(CacheError, match=r"vit_small_patch16_224.*weights differ"):
        interp.cache.open(path, model=make_model("vit", seed=1))
    with pytest.raises(CacheError, match=r"written by model 'vit_small_patch16_224'.*"
                                         r"'deit3_small_patch16_224'.*architecture differ"):
        interp.cache.open(path, model=make_model("deit3"))


def test_reader_refuses_other_format_version_and_foreign_files(vit, tmp_path):
    path = tmp_path / "acts.h5"
    interp.cache.write(vit, images(1), hooks="hook_embed", path=path, progress=False)
    with h5py.File(path, "r+") as h5:
        h5.attrs["format_version"] = 99
    with pytest.raises(CacheError, match="format version 99.*reads versions 1, 2"):
        interp.cache.open(path)
    with pytest.raises(CacheError, match="format version 99"):
        interp.cache.write(vit, images(1), hooks="hook_embed", path=path, resume=True, progress=False)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as h5:
        h5["x"] = np.zeros(3)
    with pytest.raises(CacheError, match="not an interp activation cache"):
        interp.cache.open(other)
    (tmp_path / "text.h5").write_text("hello")
    with pytest.raises(CacheError, match="cannot open.*not an HDF5 file"):
        interp.cache.open(tmp_path / "text.h5")
    with pytest.raises(CacheError, match="does not exist"):
        interp.cache.open(tmp_path / "missing.h5")


def test_bad_arguments(vit, tmp_path):
    with pytest.raises(interp.HookNameError, match="hook_resid_post"):
        interp.cache.write(vit, images(1), hooks="blocks.*.hook_resid_pots", path=tmp_path / "a.h5", progress=False)
    with pytest.raises(ValueError, match="dtype"):
        interp.cache.write(vit, images(1), hooks="hook_embed", path=tmp_path / "a.h5", dtype="int8", progress=False)
    with pytest.raises(CacheError, match="no CLS token"):
        model = interp.load("vit_small_patch16_224", pretrained=False, depth=1, class_token=False, global_pool="avg")
        interp.cache.write(model, images(1), hooks="hook_embed", path=tmp_path / "a.h5", tokens="cls", progress=False)


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_writes_cache_and_refuses_overwrite(vit, tmp_path, capsys):
    from interp.cli import main

    weights = tmp_path / "w.pth"
    torch.save(vit.timm_model.state_dict(), weights)
    folder = write_images(tmp_path / "imgs", 3)
    listing = tmp_path / "list.txt"
    listing.write_text("imgs/img002.png\nimgs/img000.png\n")
    out = tmp_path / "cli.h5"
    argv = ["cache", "vit_small_patch16_224", "--weights", str(weights), "--depth", "2", "--image-list", str(listing),
            "--hooks", "blocks.*.hook_resid_post", "blocks.0.attn.hook_pattern", "--out", str(out),
            "--batch-size", "2", "--tokens", "patches", "--dtype", "float32"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "2/2 images written" in err and "MB of activations in" in err and "file " in err
    x = interp.load_images([folder / "img002.png", folder / "img000.png"], vit)
    with interp.cache.open(out, model=vit) as cache:
        assert cache.ids == [str(tmp_path / "imgs/img002.png"), str(tmp_path / "imgs/img000.png")]
        assert cache.meta["tokens"] == "patches" and len(cache.hooks) == 3
        want = expected_hooks(vit, x, ["blocks.*.hook_resid_post", "blocks.0.attn.hook_pattern"], "patches",
                              batch_size=2)["blocks.1.hook_resid_post"]
        np.testing.assert_array_equal(cache["blocks.1.hook_resid_post"][:], want.numpy())
    assert main(argv) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(argv + ["--resume", "--no-progress"]) == 0


def test_bfloat16_model_is_cached_in_the_requested_dtype(tmp_path):
    model = make_model("vit").to(torch.bfloat16)
    x = images(2).to(torch.bfloat16)
    path = tmp_path / "bf16.h5"
    interp.cache.write(model, x, hooks="blocks.1.hook_resid_post", path=path, dtype="float32", progress=False)
    with interp.cache.open(path) as cache:
        want = expected_hooks(model, x, ["blocks.1.hook_resid_post"])["blocks.1.hook_resid_post"].float().numpy()
        np.testing.assert_array_equal(cache["blocks.1.hook_resid_post"][:], want)


def test_hook_that_does_not_fire_is_a_clear_error(vit, tmp_path):
    with pytest.raises(CacheError, match="hook_selective_votes did not fire"):
        interp.cache.write(vit, images(1), hooks="hook_selective_votes", path=tmp_path / "a.h5", progress=False)
    assert not (tmp_path / "a.h5").exists()
