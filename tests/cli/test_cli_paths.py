"""Paths refused in one line, exit status 2, before torch (issue 53): an empty input path (``--images ''`` read
every image under the working folder), an empty ``--out`` (written into the working folder), an ``--out`` whose
name the file system cannot hold (a raw ``File name too long`` at the end of the run), in every command; dangling
symlinks in an image folder (dropped without a word under ``--strict``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import one_error_line
from interp.cli import main
from interp.models import sample_image_paths
from test_cli_fifo_inputs import CASES, HOOK, IMAGE, SAE_JSON

INPUTS = [case for case, (name, _) in CASES.items()  # --neurons, --features: text or a file, refused as text
          if name != SAE_JSON and "--neurons" not in case and "--features" not in case]


@pytest.mark.parametrize("case", INPUTS)
def test_an_empty_input_path_is_refused(tmp_path, capsys, case):
    argv = CASES[case][1](tmp_path, "")
    assert main(argv) == 2
    assert "'' is an empty path" in one_error_line(capsys.readouterr().err)


OUTPUTS = {  # command -> argv without --out
    "cache": ["cache", "planted_vit", "--images", IMAGE, "--hooks", HOOK],
    "study": ["study", "norms", "planted_vit", "--images", IMAGE],
    "report": ["report", "--images", IMAGE],
    "compare": ["compare", "planted_vit", "--images", IMAGE],
    "reassess": ["reassess", "planted_vit", "--images", IMAGE],
    "sae train": ["sae", "train", "planted_vit", "--images", IMAGE, "--hook", HOOK],
    "sae import": ["sae", "import", "planted_vit", "saev", IMAGE, "--hook", HOOK],
    "patch export": ["patch", "export", "planted_vit", "--interventions", IMAGE],
    "classifier": ["classifier", "zeroshot", "--open-clip", "ViT-B-16", "--pretrained", "x", "--classes", "CLASSES"],
}


def test_every_commands_empty_or_too_long_out_is_refused_before_torch(tmp_path):
    """In a fresh interpreter: each command's ``--out ''`` and ``--out`` with a 300-byte name exit 2 with one line
    each, and torch is never imported."""
    long = str(tmp_path / ("x" * 300) / "o")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "classes.txt").write_text("cat\ndog\n")
    argvs = [[str(tmp_path / "in" / "classes.txt") if a == "CLASSES" else a for a in argv] + ["--out", out]
             for argv in OUTPUTS.values() for out in ("", long)]
    probe = ("import sys\nfrom interp.cli import main\n"
             f"codes = [main(a) for a in {argvs!r}]\n"
             "print(codes, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == f"{[2] * len(argvs)} False", (out.stdout, out.stderr)
    err = out.stderr.strip().splitlines()
    assert len(err) == len(argvs), err
    for i, line in enumerate(err):
        words = "--out '' is an empty path" if i % 2 == 0 else "--out has a name of 300 bytes ('xxx"
        assert words in line and len(line) < 200, line
    assert os.listdir(tmp_path) == ["in"]


def _folder_with_a_dangling_symlink(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    os.symlink(sample_image_paths()[0], folder / "a.jpg")
    os.symlink(tmp_path / "gone.jpg", folder / "b.jpg")  # dangling
    return folder


def test_a_dangling_symlink_in_an_image_folder_is_refused_under_strict(tmp_path, capsys):
    folder = _folder_with_a_dangling_symlink(tmp_path)
    argv = ["study", "norms", "planted_vit", "--images", str(folder), "--out", str(tmp_path / "o"), "--strict"]
    assert main(argv) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "1 image file(s) do not exist" in line and "b.jpg" in line and "dangling symlink" in line, line
    assert not (tmp_path / "o").exists()


def test_a_dangling_symlink_in_an_image_folder_is_skipped_with_a_warning(tmp_path):
    """Without --strict the run skips it as it skips a missing file of a list: one warning, recorded."""
    from interp.models.inputs.preprocessing import readable_images
    from interp.formats.image_files import list_images

    folder = _folder_with_a_dangling_symlink(tmp_path)
    skipped = []
    with pytest.warns(UserWarning, match=r"skipped unreadable image: .*b\.jpg' does not exist"):
        assert readable_images(list_images(folder), skipped=skipped) == [folder / "a.jpg"]
    assert [path for path, _ in skipped] == [str(folder / "b.jpg")]
