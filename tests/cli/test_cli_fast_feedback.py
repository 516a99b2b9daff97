"""Fast feedback: a mistyped model name, an empty or unreadable image folder, a bad list file and a held writer
lock are refused before torch is imported (pre-checks of interp.commands.prechecks), with the model-name hint
from timm's name list shipped in the package."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from interp import _model_names
from interp.cli import main
from interp.errors import ModelLoadError, UnsupportedModelError

PROBE = """
import sys
from interp.cli import main
codes = [main(argv) for argv in {argvs!r}]
heavy = sorted(m for m in ('torch', 'timm', 'h5py', 'transformer_lens', 'matplotlib', 'nnsight') if m in sys.modules)
print(codes, heavy)
"""


def test_the_shipped_name_list_is_the_installed_timms():
    from interp.models.model_list import generate

    assert json.loads(_model_names.NAMES_FILE.read_text()) == generate(), (
        "timm changed: regenerate the list with `python -m interp.models.model_list`")


def test_the_fast_name_check_says_what_the_check_after_import_says():
    from interp.models.loading import check_model_name
    from interp.models.planted import PLANTED_NAME

    assert _model_names.PLANTED_NAME == PLANTED_NAME
    for name in ("vit_tiny_patch16_2244", "resnet50", "tv_resnext50_32x4d"):
        with pytest.raises((ModelLoadError, UnsupportedModelError)) as fast:
            _model_names.check_model_name_fast(name)
        with pytest.raises(type(fast.value)) as real:
            check_model_name(name)
        if isinstance(fast.value, ModelLoadError):
            assert str(fast.value) == str(real.value)  # the same "Did you mean" hint
    for name in ("vit_small_patch14_dinov2.lvd142m", "deit3_small_patch16_224", "planted_vit"):
        assert _model_names.check_model_name_fast(name)


def test_another_timm_version_leaves_the_check_to_timm(monkeypatch):
    _model_names.shipped_names.cache_clear()
    monkeypatch.setattr(_model_names, "installed_timm_version", lambda: "0.0.1")
    try:
        assert _model_names.check_model_name_fast("vit_tiny_patch16_2244") is False
    finally:
        _model_names.shipped_names.cache_clear()


def _image(path):
    Image.new("RGB", (16, 16), (200, 30, 30)).save(path)
    return path


@pytest.mark.parametrize("case,message", [
    ("empty folder", "no image files"), ("broken file", "do not open as images"),
    ("list of missing paths", "listed paths do not exist"), ("empty list", "lists no image paths"),
])
def test_image_arguments_are_refused_in_one_line(tmp_path, capsys, case, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.png").write_bytes(b"not an image")
    (tmp_path / "missing.txt").write_text("a.png\nb.png\n")
    (tmp_path / "blank.txt").write_text("\n# nothing\n")
    given = {"empty folder": "empty", "broken file": "broken.png", "list of missing paths": "missing.txt",
             "empty list": "blank.txt"}[case]
    code = main(["study", "norms", "planted_vit", "--images", str(tmp_path / given), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0], err


def test_a_list_with_one_missing_path_runs_unless_strict(tmp_path, capsys):
    from interp.commands.prechecks import check_images
    from interp.errors import ImageError

    _image(tmp_path / "a.png")
    (tmp_path / "list.txt").write_text("a.png\ngone.png\n")
    assert check_images(str(tmp_path / "list.txt")) == 2  # the run skips gone.png and lists it under 'skipped'
    with pytest.raises(ImageError, match="1 of its 2 listed paths do not exist.*--strict"):
        check_images(str(tmp_path / "list.txt"), strict=True)


def test_pre_checks_answer_before_torch_is_imported(tmp_path):
    """One fresh interpreter: a mistyped model, an empty folder, a cache and a study output whose writer locks
    are held are all refused, and torch (or any other heavy dependency) was never imported."""
    from interp.cache.lock import WriterLock
    from interp.commands.output import atomic_output_dir

    images = tmp_path / "imgs"
    images.mkdir()
    _image(images / "a.png")
    (tmp_path / "empty").mkdir()
    (tmp_path / "acts.h5").write_bytes(b"")
    argvs = [
        ["study", "norms", "vit_tiny_patch16_2244", "--images", str(images), "--out", str(tmp_path / "o1")],
        ["study", "norms", "vit_tiny_patch16_224", "--images", str(tmp_path / "empty"), "--out", str(tmp_path / "o2")],
        ["cache", "vit_tiny_patch16_224", "--images", str(images), "--for", "norms", "--out",
         str(tmp_path / "acts.h5"), "--resume"],
        ["study", "norms", "vit_tiny_patch16_224", "--images", str(images), "--out", str(tmp_path / "o3")],
    ]
    with WriterLock(tmp_path / "acts.h5"), atomic_output_dir(tmp_path / "o3", "norms.json"):
        out = subprocess.run([sys.executable, "-c", PROBE.format(argvs=argvs)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2, 1, 1, 1] []", (out.stdout, out.stderr)  # a mistyped name: a bad value
    err = out.stderr.strip().splitlines()
    assert len(err) == 4 and "Did you mean: vit_tiny_patch16_224" in err[0] and "no image files" in err[1]
    assert "being written by another process" in err[2] and "being written by another interp run" in err[3]
