"""One-line refusals (issue 26, items 8 and 9): a cache whose /skipped group or token_rows attribute was
damaged, outputs that cannot be written (/proc, a file size limit, a full disk during --overwrite), and
--img-size / --seed values no model or RNG can take. Each was a traceback or a wrong message before."""
from __future__ import annotations

import errno
import json
import os
import resource

import h5py
import pytest
from PIL import Image

from interp.cli import main

MODEL = ["vit_tiny_patch16_224", "--no-pretrained", "--depth", "1", "--img-size", "32"]


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (32, 32), (90 * i, 200, 40)).save(folder / f"{i}.png")
    return folder


def _cache(tmp_path, images, name="acts.h5", *extra):
    path = tmp_path / name
    assert main(["cache", *MODEL, "--images", str(images), "--for", "norms", "--out", str(path), "--quiet",
                 *extra]) == 0
    return path


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interp: error: "), err
    return err[0]


def test_resume_of_a_cache_without_its_skipped_group_is_refused_in_one_line(tmp_path, images, capsys):
    path = _cache(tmp_path, images)
    with h5py.File(path, "a") as h5:
        del h5["skipped"]
    before = path.read_bytes()
    argv = ["cache", *MODEL, "--images", str(images), "--for", "norms", "--out", str(path), "--resume"]
    assert main(argv) == 1
    assert "is damaged (/skipped/index (the list of skipped images) is missing)" in _one_line(capsys)
    assert path.read_bytes() == before


def test_an_edited_token_rows_attribute_is_damage_not_a_complete_cache(tmp_path, images, capsys):
    path = _cache(tmp_path, images)
    with h5py.File(path, "a") as h5:
        h5.attrs["token_rows"] = json.dumps([0, 0])
    argv = ["cache", *MODEL, "--images", str(images), "--for", "norms", "--out", str(path), "--resume"]
    assert main(argv) == 1
    assert "attribute 'token_rows' is [0, 0], but its layout and tokens='all' give [0, 5]" in _one_line(capsys)
    assert main(["study", "norms", *MODEL, "--cache", str(path), "--out", str(tmp_path / "o")]) == 1
    assert "'token_rows' is [0, 0]" in _one_line(capsys)


def test_resume_over_an_image_whose_contents_changed_is_refused(tmp_path, images, capsys):
    """Issue 53: `cache --resume` kept the rows of an image rewritten under the same name (ids alone were
    compared; `sae train --resume` already refused it): the cache's image digest covers every file's bytes."""
    path = _cache(tmp_path, images)
    before = path.read_bytes()
    argv = ["cache", *MODEL, "--images", str(images), "--for", "norms", "--out", str(path), "--resume", "--quiet"]
    assert main(argv) == 0  # the same files: nothing to redo
    Image.new("RGB", (32, 32), (7, 7, 7)).save(images / "1.png")
    assert main(argv) == 1
    line = _one_line(capsys)
    assert "cannot resume" in line and "images_sha256 differs (other images, or files whose contents changed)" in line
    assert path.read_bytes() == before


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux's /proc")
@pytest.mark.parametrize("command", [["cache", *MODEL, "--images", "IMGS", "--for", "norms", "--out", "/proc/x.h5"],
                                     ["study", "norms", *MODEL, "--images", "IMGS", "--out", "/proc/x"]])
def test_an_output_under_proc_is_refused_in_one_line(images, capsys, command):
    assert main([str(images) if a == "IMGS" else a for a in command]) == 2  # a path no file can be made in
    assert "cannot create a file in '/proc'" in _one_line(capsys)


@pytest.mark.parametrize("flag,value,message", [
    ("--img-size", "100000", "expected an input size in pixels 1..4096"),
    ("--seed", "1180591620717411303424", "expected a whole number 0..4294967295"),
    ("--img-size", "7", "--img-size 7 is smaller than one patch of vit_tiny_patch16_224 (16x16 px)"),
])
def test_sizes_and_seeds_no_model_can_take_are_bad_values(tmp_path, images, capsys, flag, value, message):
    argv = ["study", "norms", "vit_tiny_patch16_224", "--no-pretrained", "--depth", "1", flag, value,
            "--images", str(images), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert message in _one_line(capsys)


def test_a_figure_past_the_file_size_limit_is_one_line_and_leaves_no_result(tmp_path, images, capsys, monkeypatch):
    from matplotlib.figure import Figure

    def too_large(self, fname, *args, **kwargs):
        raise OSError(errno.EFBIG, "File too large", str(fname))

    monkeypatch.setattr(Figure, "savefig", too_large)
    out = tmp_path / "o"
    assert main(["study", "norms", *MODEL, "--images", str(images), "--out", str(out), "--quiet"]) == 1
    assert "larger than this system allows" in _one_line(capsys)
    assert not (out / "norms.json").exists()


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_an_exported_patch_past_ulimit_f_is_one_line_and_keeps_the_old_file(tmp_path, capsys, suffix):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"kind": "NeuronAblation", "neurons": {"0": [3]}, "mode": "zero"}]))
    out = tmp_path / f"w{suffix}"
    out.write_bytes(b"keep me")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))  # the state dict is ~2 MB (what `ulimit -f` does)
    try:
        code = main(["patch", "export", *MODEL, "--interventions", str(spec), "--as-weights", "--out", str(out),
                     "--overwrite"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 1
    assert "larger than this system allows" in _one_line(capsys)
    assert out.read_bytes() == b"keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["spec.json", out.name]


def test_overwrite_on_a_full_disk_says_the_old_file_is_kept_not_new_rows(tmp_path, images, capsys, monkeypatch):
    from interp.cache import integrity

    path = _cache(tmp_path, images)
    before = path.read_bytes()
    monkeypatch.setattr(integrity, "free_bytes", lambda folder: 0)
    argv = ["cache", *MODEL, "--images", str(images), "--for", "norms", "--out", str(path), "--overwrite"]
    assert main(argv) == 1
    line = _one_line(capsys)
    assert "nothing of this run is kept" in line and "is unchanged" in line and "rows committed" not in line
    assert path.read_bytes() == before
