"""``--out ... --overwrite`` never replaces anything but a regular file or a folder of interp's: a device node, a
FIFO or a symlink to a device, as the output or as a file a result would replace inside its folder, is refused
in one line (exit status 2) by every command that writes, before any model loads, and is left as it was."""
from __future__ import annotations

import json
import os
import stat

import pytest

from conftest import character_device, one_error_line
from interp.cli import main
from interp.errors import OutputPathError
from interp.models import sample_image_paths

IMAGE = str(sample_image_paths()[0])
HOOK = "blocks.0.hook_resid_post"


def _spec(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps([{"kind": "NeuronAblation", "neurons": {"2": [1]}}]))
    return str(path)


def _classes(tmp_path):
    path = tmp_path / "classes.txt"
    path.write_text("cat\ndog\n")
    return str(path)


# command -> argv writing to OUT (a file for cache/patch/classifier, a folder for the rest)
COMMANDS = {
    "cache": lambda t, out: ["cache", "planted_vit", "--images", IMAGE, "--hooks", HOOK, "--out", out],
    "patch export": lambda t, out: ["patch", "export", "planted_vit", "--interventions", _spec(t), "--out", out],
    "classifier zeroshot": lambda t, out: ["classifier", "zeroshot", "--open-clip", "ViT-B-16", "--pretrained", "x",
                                           "--classes", _classes(t), "--out", out],
    "study": lambda t, out: ["study", "norms", "planted_vit", "--images", IMAGE, "--out", out],
    "report": lambda t, out: ["report", "--out", out],
    "compare": lambda t, out: ["compare", "planted_vit", "--images", IMAGE, "--out", out],
    "reassess": lambda t, out: ["reassess", "planted_vit", "--images", IMAGE, "--no-probes", "--out", out],
    "sae train": lambda t, out: ["sae", "train", "planted_vit", "--images", IMAGE, "--hook", "blocks.3.hook_resid_post",
                                 "--out", out],
}
# inside a result folder: the file a second run would replace
INNER = {"study": "norms.json", "report": "report.json", "compare": "compare.json", "reassess": "reassess.json",
         "sae train": "sae.safetensors"}


def _make(kind: str, path) -> str:
    """A non-regular entry at ``path``; returns the words its refusal names."""
    if kind == "fifo":
        os.mkfifo(path)
        return "FIFO"
    if kind == "device link":
        os.symlink(character_device(), path)
        return "symlink to a character device"
    if os.geteuid() != 0:  # only root creates device nodes; the link above covers the same refusal
        pytest.skip("creating a device node needs root")
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers: harmless if written
    return "character device"


def _unchanged(path, kind: str) -> bool:
    mode = os.lstat(path).st_mode
    return {"fifo": stat.S_ISFIFO, "device link": stat.S_ISLNK, "device node": stat.S_ISCHR}[kind](mode)


@pytest.mark.parametrize("kind", ["fifo", "device link", "device node"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_overwrite_never_replaces_a_device_or_fifo(tmp_path, capsys, command, kind):
    out = tmp_path / "out"
    words = _make(kind, out)
    assert main([*COMMANDS[command](tmp_path, str(out)), "--overwrite"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert words in line and "--overwrite" in line, line
    assert _unchanged(out, kind)


@pytest.mark.parametrize("kind", ["fifo", "device link"])
@pytest.mark.parametrize("command", list(INNER))
def test_a_device_or_fifo_where_a_result_file_goes_is_refused(tmp_path, capsys, command, kind):
    out = tmp_path / "out"
    out.mkdir()
    inner = out / INNER[command]
    words = _make(kind, inner)
    assert main([*COMMANDS[command](tmp_path, str(out)), "--overwrite"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert words in line and str(inner) in line, line
    assert _unchanged(inner, kind)


def test_atomic_file_checks_again_before_the_rename(tmp_path):
    """A FIFO that appears at the output while the file is being written is not replaced either."""
    from interp.commands.output import atomic_file

    out = tmp_path / "late.safetensors"
    with pytest.raises(OutputPathError):
        with atomic_file(out) as tmp:
            tmp.write_bytes(b"data")
            os.mkfifo(out)
    assert stat.S_ISFIFO(os.lstat(out).st_mode) and not list(tmp_path.glob(".interp-staging-*"))


def test_special_kind_names_what_it_finds(tmp_path):
    from interp.paths import special_kind

    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "file", tmp_path / "file-link")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    assert special_kind(tmp_path / "file") is None and special_kind(tmp_path) is None
    assert special_kind(tmp_path / "file-link") is None and special_kind(tmp_path / "missing") is None
    assert "dangling" in special_kind(tmp_path / "dangling")


def test_a_mistyped_model_name_is_a_bad_value_exit_2(capsys):
    """The README: status 2 for a bad command-line value (a mistyped model name exited 1)."""
    assert main(["hooks", "vit_tiny_patch16_2244"]) == 2
    assert "Did you mean: vit_tiny_patch16_224" in one_error_line(capsys.readouterr().err)


LOCKED = {  # command -> (argv builder, the marker whose lock a running writer holds)
    "cache": ("cache", None),
    "study": ("study", "norms.json"),
    "report": ("report", "report.json"),
    "compare": ("compare", "compare.json"),
    "reassess": ("reassess", "reassess.json"),
    "sae train": ("sae train", "sae.json"),
}


@pytest.mark.parametrize("command", list(LOCKED))
def test_a_second_writer_of_the_same_output_is_refused_in_one_line(tmp_path, capsys, command):
    """The lock battery: while one run writes an output, a second run of any writing command into it is refused
    (before: two `sae train` into one folder lost an SAE in 2 of 6 trials)."""
    from interp.cache.lock import WriterLock

    name, marker = LOCKED[command]
    out = tmp_path / ("acts.h5" if marker is None else "out")
    held = WriterLock(out if marker is None else out / marker)
    with held:
        code = main([*COMMANDS[name](tmp_path, str(out)), "--overwrite"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 1 and ("being written" in line or "being trained into" in line), (code, line)


def test_the_cache_api_never_writes_over_a_device_behind_a_link(tmp_path):
    """interp.cache.write writes at the link's resolved path: as root, a link to /dev/zero with overwrite=True
    replaced /dev/zero itself with an HDF5 file (the CLI refuses first; the library now refuses too)."""
    import interp
    from conftest import images, make_model
    from interp.errors import CacheError

    link = tmp_path / "acts.h5"
    os.symlink(character_device(), link)
    with pytest.raises(CacheError, match="not a regular file"):
        interp.cache.write(make_model("vit"), images(1), hooks=[HOOK], path=link, overwrite=True, progress=False)
    assert os.path.islink(link)
