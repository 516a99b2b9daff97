"""CLI messages (issue 26, item 7): an interrupted ``interp cache`` says what is committed and how to continue;
``--top-k`` above the neurons that exist is capped with a note; a cache from another model is refused with
command-line advice (the seed when only the random-weights seed differs); ``--out`` of the wrong kind exits 2."""
from __future__ import annotations

import json
import shlex

import pytest
from PIL import Image

from interp.cli import main

MODEL = ["vit_tiny_patch16_224", "--no-pretrained", "--depth", "1", "--img-size", "32"]


def _images(folder, n):
    folder.mkdir()
    for i in range(n):
        Image.new("RGB", (32, 32), (30 * i, 200 - 20 * i, 90)).save(folder / f"{i}.png")
    return folder


def test_ctrl_c_on_cache_says_what_is_committed_and_the_resume_command(tmp_path, capsys, monkeypatch):
    import interp.cache.file_writer as file_writer

    images = _images(tmp_path / "imgs", 4)
    out = tmp_path / "acts.h5"
    argv = ["cache", *MODEL, "--images", str(images), "--for", "norms", "--out", str(out), "--batch-size", "2",
            "--no-progress"]
    real_iter = file_writer.Prefetcher.__iter__

    def first_batch_then_ctrl_c(self):
        for i, batch in enumerate(real_iter(self)):
            if i == 1:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(file_writer.Prefetcher, "__iter__", first_batch_then_ctrl_c)
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interp: interrupted: 2 of 4 images are committed in "), err
    command = err[0].split("continue with `", 1)[1].rstrip("`")
    assert command.endswith("--resume")
    monkeypatch.undo()
    assert main(shlex.split(command)[1:]) == 0  # the command it gives continues the cache


def test_top_k_above_the_neurons_that_exist_is_capped_with_a_note(tmp_path, capsys, photos16):
    code = main(["study", "neurons", "planted_vit", "--images", str(photos16), "--top-k", "100000000",
                 "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == 0
    data = json.loads((tmp_path / "o" / "neurons.json").read_text())
    n = len(data["neurons"])
    assert data["top_k"] == n == (data["highest_layer"] + 1) * 768 and data["params"]["top_k"] == n
    shown = capsys.readouterr().out
    assert f"note: --top-k 100000000 is more than the {n} neurons" in shown
    assert len(shown) < 2000 and f"and {n - 50} more (all in neurons.json)" in shown


def test_a_cache_of_another_seed_is_refused_with_the_seed_to_pass(tmp_path, capsys):
    images = _images(tmp_path / "imgs", 2)
    cache = tmp_path / "acts.h5"
    assert main(["cache", *MODEL, "--images", str(images), "--for", "norms", "--out", str(cache), "--quiet"]) == 0
    code = main(["study", "norms", *MODEL, "--seed", "3", "--cache", str(cache), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "the weights differ." in err[0] and "differ only by their seed" in err[0] and "rerun with --no-pretrained --seed 0" in err[0]
    assert "`interp cache vit_tiny_patch16_224 --images DIR" in err[0]
    assert main(["study", "norms", *MODEL, "--seed", "0", "--cache", str(cache), "--out", str(tmp_path / "o"),
                 "--quiet"]) == 0


def test_a_cache_of_another_architecture_says_it_differs(tmp_path, capsys):
    images = _images(tmp_path / "imgs", 2)
    cache = tmp_path / "acts.h5"
    assert main(["cache", *MODEL, "--images", str(images), "--for", "norms", "--out", str(cache), "--quiet"]) == 0
    other = ["vit_tiny_patch16_224", "--no-pretrained", "--depth", "2", "--img-size", "32"]
    assert main(["study", "norms", *other, "--cache", str(cache), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "the architecture differs." in err and "--no-pretrained --seed 0" in err


@pytest.mark.parametrize("command", [["study", "norms", "planted_vit", "--images", "IMGS"], ["report"]])
def test_out_naming_an_existing_file_is_a_bad_value(tmp_path, capsys, command):
    images = _images(tmp_path / "imgs", 1)
    (tmp_path / "file").write_text("mine")
    argv = [str(images) if a == "IMGS" else a for a in command]
    assert main([*argv, "--out", str(tmp_path / "file")]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "mine"
