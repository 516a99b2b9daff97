"""Bad command-line input gets one line, fast: every value, path and option that can be checked before a model
exists is refused before torch is imported (well under a second), with exit status 2 for a bad value and 1 for
an output that is in the way; block numbers and hook names are refused right after the model is built.

The pre-model cases run in ONE fresh interpreter (so ``sys.modules`` tells whether torch was imported; that,
not a clock, is what makes a refusal fast on any machine); the tests below read its findings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import early
from interp.cli import build_parser, main
from interp.models import sample_image_paths

PHOTOS = str(sample_image_paths()[0].parent)
IMAGE = str(sample_image_paths()[0])


def _study(name: str, *extra: str, out: str = "OUT/o") -> list:
    return ["study", name, "planted_vit", "--images", PHOTOS, "--out", out, *extra]


# (id, argv with TMP/... placeholders, expected exit status, a word the message must hold)
BAD_INPUTS = [
    ("top-k -5", _study("neurons", "--top-k", "-5"), 2, "--top-k"),
    ("top-k 0", _study("neurons", "--top-k", "0"), 2, "--top-k"),
    ("report top-k 0", ["report", "--top-k", "0", "--out", "OUT/r"], 2, "--top-k"),
    ("batch-size 0", _study("norms", "--batch-size", "0"), 2, "--batch-size"),
    ("batch-size -1", _study("norms", "--batch-size", "-1"), 2, "--batch-size"),
    ("cache batch-size 0", ["cache", "planted_vit", "--images", PHOTOS, "--for", "norms", "--out", "OUT/a.h5",
                            "--batch-size", "0"], 2, "--batch-size"),
    ("batch-size 1.5", _study("norms", "--batch-size", "1.5"), 2, "whole number"),
    ("max-images 0", _study("neurons", "--max-images", "0"), 2, "--max-images"),
    ("img-size 0", _study("norms", "--img-size", "0"), 2, "--img-size"),
    ("img-size -5", _study("norms", "--img-size", "-5"), 2, "--img-size"),
    ("depth 0", _study("norms", "--depth", "0"), 2, "--depth"),
    ("controls -1", _study("ablate", "--neurons", "2:17", "--controls", "-1"), 2, "--controls"),
    ("report controls -1", ["report", "--controls", "-1", "--out", "OUT/r"], 2, "--controls"),
    ("seed -1", _study("norms", "--seed", "-1"), 2, "--seed"),
    ("n-boot 0", _study("pib", "--boxes", "TMP/boxes.csv", "--n-boot", "0"), 2, "--n-boot"),
    ("n-registers 0", _study("registers", "--neurons", "2:17", "--n-registers", "0"), 2, "--n-registers"),
    ("n-registers -1", _study("registers", "--neurons", "2:17", "--n-registers", "-1"), 2, "--n-registers"),
    ("n-registers 20000", _study("registers", "--neurons", "2:17", "--n-registers", "20000"), 2, "at most"),
    ("max-box-fraction -1", _study("pib", "--boxes", "TMP/boxes.csv", "--max-box-fraction", "-1"), 2, "(0, 1]"),
    ("max-box-fraction 0", _study("pib", "--boxes", "TMP/boxes.csv", "--max-box-fraction", "0"), 2, "(0, 1]"),
    ("max-box-fraction 1.5", _study("pib", "--boxes", "TMP/boxes.csv", "--max-box-fraction", "1.5"), 2, "(0, 1]"),
    ("level 1.5", _study("pib", "--boxes", "TMP/boxes.csv", "--level", "1.5"), 2, "--level"),
    ("threshold 0", _study("norms", "--threshold", "0"), 2, "--threshold"),
    ("threshold -5", _study("norms", "--threshold", "-5"), 2, "--threshold"),
    ("threshold p0", _study("norms", "--threshold", "p0"), 2, "pNN"),
    ("threshold p100", _study("norms", "--threshold", "p100"), 2, "pNN"),
    ("threshold p200", _study("neurons", "--threshold", "p200"), 2, "pNN"),
    ("threshold abc", _study("norms", "--threshold", "abc"), 2, "--threshold"),
    ("threshold nan", _study("norms", "--threshold", "nan"), 2, "--threshold"),
    ("threshold inf", _study("norms", "--threshold", "inf"), 2, "--threshold"),
    ("report threshold -1", ["report", "--threshold", "-1", "--out", "OUT/r"], 2, "--threshold"),
    ("probes threshold 0", _study("probes", "--threshold", "0"), 2, "--threshold"),
    ("compare threshold 0", ["compare", "planted_vit", "--threshold", "0"], 2, "--threshold"),
    ("masking outlier-threshold 0", _study("masking", "--outlier-threshold", "0"), 2, "--outlier-threshold"),
    ("masking fractions 1", _study("masking", "--fractions", "0", "1"), 2, "--fractions"),
    ("probes test-fraction 1", _study("probes", "--test-fraction", "1"), 2, "--test-fraction"),
    ("lost k 0", _study("lost", "--k", "0"), 2, "--k"),
    ("device bogus", _study("norms", "--device", "bogus"), 2, "cuda:N"),
    ("device gpu", _study("norms", "--device", "gpu"), 2, "'cuda'"),
    ("cache device gpu", ["cache", "planted_vit", "--images", PHOTOS, "--for", "norms", "--out", "OUT/a.h5",
                          "--device", "gpu"], 2, "--device"),
    ("report device bogus", ["report", "--device", "bogus", "--out", "OUT/r"], 2, "--device"),
    ("compare device bogus", ["compare", "planted_vit", "--device", "bogus"], 2, "--device"),
    ("missing images", ["study", "norms", "planted_vit", "--images", "TMP/nope", "--out", "OUT/o"], 2,
     "does not exist"),
    ("report missing images", ["report", "--images", "TMP/nope", "--out", "OUT/r"], 2, "does not exist"),
    ("missing cache", ["study", "norms", "planted_vit", "--cache", "TMP/nope.h5", "--out", "OUT/o"], 2,
     "does not exist"),
    ("missing boxes", _study("pib", "--boxes", "TMP/nope.csv"), 2, "does not exist"),
    ("missing weights", _study("norms", "--weights", "TMP/nope.pth"), 2, "does not exist"),
    ("missing image-list", ["cache", "planted_vit", "--image-list", "TMP/nope.txt", "--for", "norms",
                            "--out", "OUT/a.h5"], 2, "does not exist"),
    ("binary image-list", ["cache", "planted_vit", "--image-list", "TMP/binary.txt", "--for", "norms",
                           "--out", "OUT/a.h5"], 2, "not a text file"),
    ("image-list not .txt", ["cache", "planted_vit", "--image-list", IMAGE, "--for", "norms",
                             "--out", "OUT/a.h5"], 2, ".txt"),
    ("cache nothing to cache", ["cache", "planted_vit", "--images", PHOTOS, "--out", "OUT/a.h5"], 2, "--for"),
    ("cache unknown study", ["cache", "planted_vit", "--images", PHOTOS, "--for", "nroms", "--out", "OUT/a.h5"], 2,
     "nroms"),
    ("cache out exists", ["cache", "planted_vit", "--images", PHOTOS, "--for", "norms", "--out", "TMP/existing.h5"],
     1, "--resume"),
    ("cache out is a folder", ["cache", "planted_vit", "--images", PHOTOS, "--for", "norms", "--out", "TMP/folder",
                               "--overwrite"], 2, "is a folder"),
    ("cache out under a file", ["cache", "planted_vit", "--images", PHOTOS, "--for", "norms",
                                "--out", "TMP/existing.h5/a.h5"], 2, "which is a file"),
    ("study out under a file", _study("norms", out="TMP/existing.h5/o"), 2, "which is a file"),
    ("study out is a file", _study("norms", out="TMP/existing.h5"), 2, "is a file"),
    ("study result exists", _study("norms", out="TMP/done"), 1, "--overwrite"),
    ("report out under a file", ["report", "--out", "TMP/existing.h5/r"], 2, "which is a file"),
    ("report out is a file", ["report", "--out", "TMP/existing.h5"], 2, "is a file"),
    ("report foreign folder", ["report", "--out", "TMP/folder", "--overwrite"], 1, "not a report folder"),
    ("compare out under a file", ["compare", "planted_vit", "--out", "TMP/existing.h5/c"], 2, "which is a file"),
    ("compare weights count", ["compare", "planted_vit", "planted_vit", "--weights", "TMP/w.pth"], 2,
     "one value per model"),
    ("compare img-size 0", ["compare", "planted_vit", "--img-size", "0"], 2, "--img-size"),
    ("compare missing weights", ["compare", "planted_vit", "planted_vit", "--weights", "TMP/nope.pth", "-"], 2,
     "does not exist"),
    ("patch export missing spec", ["patch", "export", "planted_vit", "--interventions", "TMP/nope.json",
                                   "--out", "OUT/p.safetensors"], 2, "does not exist"),
    ("patch export out exists", ["patch", "export", "planted_vit", "--interventions", "TMP/w.pth",
                                 "--out", "TMP/existing.h5"], 1, "already exists"),
    ("patch apply missing file", ["patch", "apply", "planted_vit", "TMP/nope.safetensors"], 2, "does not exist"),
    ("patch apply tol -1", ["patch", "apply", "planted_vit", "TMP/w.pth", "--tol", "-1"], 2, "--tol"),
    ("unknown option", _study("norms", "--bogus-flag"), 2, "unrecognized"),
    ("unknown study", ["study", "nroms", "planted_vit"], 2, "invalid choice"),
    ("missing --out", ["study", "norms", "planted_vit", "--images", PHOTOS], 2, "--out"),
    ("masks is a FIFO", _study("segment", "--masks", "TMP/masks.fifo", out="OUT/o"), 2, "FIFO"),
]

RUNNER = r"""
import contextlib, io, json, os, sys
import PIL.Image, interp.cli
from interp.detection.spec import DetectionSpec
# The parser, the study declarations and the image checks are loaded once (all torch-free), then each case runs
# in a forked child: what a case imports is gone with it.
interp.cli.build_parser()
cases = json.loads(sys.argv[1])
found = {}
for name, argv in cases:
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = interp.cli.main(argv)
        got = {"rc": rc, "err": err.getvalue(), "torch": "torch" in sys.modules}
        os.write(write, json.dumps(got).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        found[name] = json.loads(f.read())
    os.wait()
print(json.dumps(found))
"""


@early.launcher("bad inputs")
def launch_bad_inputs(tmp: Path) -> early.Launch:
    """Every case of BAD_INPUTS in one fresh interpreter (RUNNER), with the files they name made in ``tmp``."""
    (tmp / "existing.h5").write_bytes(b"not a cache, but in the way")
    (tmp / "folder").mkdir()
    (tmp / "folder" / "notes.txt").write_text("mine")
    (tmp / "done").mkdir()
    (tmp / "done" / "norms.json").write_text("{}")
    (tmp / "boxes.csv").write_text("image,x0,y0,x1,y1\nastronaut.jpg,0,0,10,10\n")
    (tmp / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (tmp / "w.pth").write_bytes(b"\0" * 16)
    os.mkfifo(tmp / "masks.fifo")  # reading it would wait for a writer forever

    def fill(arg: str) -> str:
        return arg.replace("TMP/", f"{tmp}/").replace("OUT/", f"{tmp}/new/")

    cases = [(name, [fill(a) for a in argv]) for name, argv, _, _ in BAD_INPUTS]
    return early.Launch([sys.executable, "-c", RUNNER, json.dumps(cases)])


@pytest.fixture(scope="module")
def findings():
    run = early.result("bad inputs")
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    tmp = run.workdir
    assert not (tmp / "new").exists()  # nothing was written, not even the output folders
    assert (tmp / "existing.h5").read_bytes() == b"not a cache, but in the way"
    assert (tmp / "folder" / "notes.txt").read_text() == "mine" and (tmp / "done" / "norms.json").read_text() == "{}"
    return found


@pytest.mark.early("bad inputs")
@pytest.mark.parametrize("name, argv, status, word", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_before_torch(findings, name, argv, status, word):
    got = findings[name]
    lines = got["err"].splitlines()
    assert got["rc"] == status, got
    assert len(lines) == 1 and lines[0].startswith("interp: error: "), got["err"]
    assert word in lines[0] and "Traceback" not in got["err"]
    assert not got["torch"], f"{name}: torch was imported before the refusal"


def test_the_cache_refuses_an_existing_file_at_once(tmp_path):
    """18 #3: as a user types it (a fresh interpreter): refused before torch is imported (it used to load torch
    and the model first, 7.6 s)."""
    existing = tmp_path / "existing.h5"
    existing.write_bytes(b"x")
    code = "import sys; from interp.cli import main; rc = main(); print('torch' in sys.modules); sys.exit(rc)"
    run = subprocess.run([sys.executable, "-c", code, "cache", "planted_vit", "--images", PHOTOS,
                          "--for", "norms", "--out", str(existing)], capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "already exists" in run.stderr
    assert run.stdout.strip() == "False", "torch was imported before the refusal"


# ------------------------------------------------------------------------------------ after the model is built
@pytest.mark.parametrize("extra, word", [
    (["--detect-layer", "6"], "--detect-layer 6 is out of range"),
    (["--detect-layer", "-7"], "--detect-layer -7 is out of range"),
    (["--highest-layer", "40"], "--highest-layer 40"),
])
def test_block_numbers_are_checked_against_the_model_before_any_forward(tmp_path, capsys, monkeypatch, extra, word):
    import interp.studies.artifacts.neurons  # noqa: F401  (binds the real function first)
    from interp.studies import declaration
    from interp.studies.artifacts.configs import NeuronsConfig

    monkeypatch.setitem(declaration._FUNCTIONS, NeuronsConfig, lambda *a, **k: pytest.fail("the study ran"))
    assert main(_study("neurons", *extra, out=str(tmp_path / "o"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and word in err and "planted_vit has 6 blocks" in err
    assert not (tmp_path / "o" / "neurons.json").exists()


def test_a_misspelled_hook_on_a_live_run_offers_close_matches_not_cache_advice(tmp_path, capsys):
    assert main(_study("probes", "--hook", "blocks.5.hook_resid_pst", out=str(tmp_path / "o"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Close matches: blocks.5.hook_resid_post" in err
    assert "cache" not in err and "interp hooks planted_vit" in err


def test_device_that_this_machine_lacks_is_one_line_naming_what_exists(tmp_path, capsys, monkeypatch):
    import torch

    import interp.hooks.load

    monkeypatch.setattr(interp.hooks.load, "load", lambda *a, **k: pytest.fail("the model was built"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1"):
        assert main(_study("norms", "--device", device, out=str(tmp_path / "o"))) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--device {device}: no CUDA GPU" in err and "available: cpu" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["report", "--device", "cuda:1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "1 CUDA GPU(s); available: cpu, cuda:0" in err
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------------------------ help
def _options(parser, path):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, [*path, name])
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield " ".join(path), "/".join(action.option_strings) or action.dest, action.help


def test_every_option_of_every_command_has_help():
    options = list(_options(build_parser(), ["interp"]))
    assert len(options) > 150  # the walk reached every sub-command
    missing = [f"{command} {option}" for command, option, text in options if not (text and text.strip())]
    assert missing == []


# ------------------------------------------------------------------------------------------------ compare
def test_compare_mixes_a_weights_file_and_a_random_model(tmp_path, capsys):
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    trained = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64)
    weights = tmp_path / "trained.safetensors"
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(weights))
    # one --img-size serves both models; `--weights FILE -`: the second model has no file (random weights)
    argv = ["compare", "vit_tiny_patch16_224", "vit_tiny_patch16_224", "--weights", str(weights), "-",
            "--no-pretrained", "--img-size", "64", "--no-probes", "--images", IMAGE, "--out", str(tmp_path / "c")]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "vit_tiny_patch16_224 (trained.safetensors)" in table and "vit_tiny_patch16_224 (random)" in table
    rows = json.loads((tmp_path / "c" / "compare.json").read_text())["rows"]
    assert len(rows) == 2


def test_probes_on_a_single_image_give_the_reason_not_a_split_error():
    """`interp report --images one.jpg` stopped at the probes ("a train/test split needs at least 2 samples");
    one image now gets every probe's reason (too few images) and the report goes on."""
    import interp
    from interp.studies import open_source
    from interp.detection.spec import DetectionSpec
    from interp.studies.probes.probes import probes_study

    source = open_source(model=interp.load("planted_vit"), images=[IMAGE])
    result = probes_study(source, detection=DetectionSpec(threshold="p98"), progress=False)
    assert result.n_images == 1 and result.n_train_images == 0 and "too few images (n=1)" in result.too_few
    assert all(s.score is None and "n=1" in s.note for s in [*result.position.values(), *result.pixels.values()])
