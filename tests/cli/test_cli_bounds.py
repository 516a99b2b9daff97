"""Sizes beyond what a model or the data holds are refused in one line with status 2 (issue 35): before, they
ended in a raw traceback or ran until memory or time ran out."""
from __future__ import annotations

import pytest

from conftest import one_error_line
from interp.cli import main
from interp.errors import UsageError
from interp.studies.artifacts.ablate import random_controls


def test_report_top_k_beyond_the_model_is_refused_before_the_studies(tmp_path, capsys):
    assert main(["report", "--top-k", "1000", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--top-k 1000" in line and "give --top-k <= 384" in line, line
    assert not (tmp_path / "r").exists()


def test_controls_that_cannot_be_drawn_are_one_line():
    with pytest.raises(UsageError, match="too few for controls of 3"):
        random_controls({2: [0, 1, 2]}, 5, n_controls=1, seed=0)
    assert random_controls({2: [0, 1, 2]}, 5, n_controls=0, seed=0) == []
    assert len(random_controls({2: [0, 1]}, 4, n_controls=2, seed=0)) == 2


def test_arguments_the_config_refutes_are_refused_before_torch(tmp_path):
    """--detect-layer 9 on a 6-block model, a hook of block 9, --features 999 of a 384-feature SAE, an SAE folder
    another run trains into (for sae train and sae import), an import --out that is a file: refused in a fresh
    interpreter without importing torch (they arrived after 10-15 s of model loading)."""
    import json
    import subprocess
    import sys

    from interp.models import sample_image_paths

    image = str(sample_image_paths()[0])
    sae = tmp_path / "sae"
    sae.mkdir()
    (sae / "sae.json").write_text(json.dumps({"hook": "blocks.3.hook_resid_post", "n_features": 384}))
    argvs = [
        ["study", "norms", "planted_vit", "--images", image, "--detect-layer", "9", "--out", str(tmp_path / "a")],
        ["study", "norms", "vit_small_patch16_224", "--depth", "2", "--images", image, "--detect-layer", "2",
         "--out", str(tmp_path / "b")],
        ["sae", "train", "planted_vit", "--images", image, "--hook", "blocks.9.hook_resid_post",
         "--out", str(tmp_path / "c")],
        ["study", "ablate", "planted_vit", "--images", image, "--sae", str(sae), "--features", "3,999",
         "--out", str(tmp_path / "d")],
        ["sae", "train", "planted_vit", "--images", image, "--hook", "blocks.3.hook_resid_post",
         "--out", str(tmp_path / "busy")],
        ["sae", "import", "planted_vit", "saelens", str(sae), "--out", str(sae / "sae.json")],
        ["sae", "import", "planted_vit", "saelens", str(sae), "--out", str(tmp_path / "busy"), "--overwrite"],
    ]
    from interp.cache.lock import WriterLock

    (tmp_path / "busy").mkdir()
    held = WriterLock(tmp_path / "busy" / "sae.json").acquire()  # another run trains into busy/
    probe = ("import sys\nfrom interp.cli import main\n"
             f"codes = [main(a) for a in {argvs!r}]\n"
             "print(codes, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    held.release()
    assert out.stdout.strip() == "[2, 2, 2, 2, 1, 2, 1] False", (out.stdout, out.stderr)
    err = out.stderr.strip().splitlines()
    assert "planted_vit has 6 blocks" in err[0] and "has 2 blocks" in err[1] and "blocks.9" in err[2], err
    assert "feature 999 does not exist" in err[3] and "384 features" in err[3], err
    assert "being trained into by another interp run" in err[4], err
    assert "is a file; give a folder" in err[5] and "being written by another interp run" in err[6], err


@pytest.mark.parametrize("where, status, words", [
    ("file", 2, "is a file"), ("under a file", 2, "lies under"), ("/proc/x", 2, "in '/proc'"),
])
def test_sae_train_out_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, where, status, words):
    """`sae train --out` an existing file, a path under a file, /proc/x: raw tracebacks before."""
    from interp.models import sample_image_paths

    (tmp_path / "f").write_text("mine")
    out = {"file": tmp_path / "f", "under a file": tmp_path / "f" / "sub", "/proc/x": "/proc/x"}[where]
    argv = ["sae", "train", "planted_vit", "--images", str(sample_image_paths()[0]), "--hook",
            "blocks.3.hook_resid_post", "--out", str(out), "--overwrite"]
    assert main(argv) == status
    assert words in one_error_line(capsys.readouterr().err)
    assert (tmp_path / "f").read_text() == "mine"


def test_sae_train_defaults_on_a_handful_of_photos_say_what_to_change_at_once(capsys):
    """With its defaults on the 4 sample photos `sae train` failed after 15 s ("cannot fill 8 data shards")."""
    from interp.models import sample_image_paths

    folder = str(sample_image_paths()[0].parent)
    argv = ["sae", "train", "planted_vit", "--images", folder, "--hook", "blocks.3.hook_resid_post", "--out", "x"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "fewer than --data-shards 8" in line and "--data-shards 1" in line, line


@pytest.mark.parametrize("extra, words", [
    (["--holdout", "1.5"], "argument --holdout: expected a number in [0, 1)"),  # exit 1, after torch, before
    (["--arch", "matryoshka", "--k", "5000"], "--k 5000 is more than the SAE's 1536 features"),  # a traceback before
])
def test_sae_train_settings_the_data_refutes_are_one_line_usage_errors(tmp_path, capsys, extra, words):
    from interp.models import sample_image_paths

    argv = ["sae", "train", "planted_vit", "--images", str(sample_image_paths()[0].parent), "--hook",
            "blocks.2.hook_resid_post", "--out", str(tmp_path / "s"), "--steps", "2", "--data-shards", "1",
            "--tokens-per-step", "64", "--no-progress"] + extra
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert words in line, line
    assert not (tmp_path / "s" / "sae.safetensors").exists()


# ------------------------------------------------------------------ on the model's skeleton, before its load
def _forbid_model_builds(monkeypatch) -> None:
    """From here on timm may build models only on torch's meta device (a skeleton): building one with real
    tensors (random init, then a weight file's read) fails the test."""
    import timm
    import torch

    real = timm.create_model

    def create_model(name, *args, **kwargs):
        if torch.get_default_device().type != "meta":
            pytest.fail(f"{name} was built for real")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(timm, "create_model", create_model)


def _test_vit_weights(tmp_path):
    """A weight file of timm's test_vit (6 blocks) trained at 64 px: a file that sets the input size."""
    import timm
    from safetensors.torch import save_file

    path = tmp_path / "test_vit.safetensors"
    save_file(timm.create_model("test_vit", pretrained=False, img_size=64).state_dict(), str(path))
    return str(path)


@pytest.mark.parametrize("argv, words", [
    (["study", "norms", "vit_tiny_patch16_224", "--no-pretrained", "--detect-layer", "40"],
     "--detect-layer 40 is out of range: vit_tiny_patch16_224 has 12 blocks"),
    (["study", "probes", "vit_tiny_patch16_224", "--no-pretrained", "--layer", "99"],
     "--layer 99 is out of range: vit_tiny_patch16_224 has 12 blocks"),
    (["study", "probes", "vit_tiny_patch16_224", "--no-pretrained", "--hook", "blocks.3.mlp.hook_postt"],
     "Close matches: blocks.3.mlp.hook_post"),
    (["study", "norms", "vit_tiny_patch16_224", "--no-pretrained", "--img-size", "8"],
     "--img-size 8 is smaller than one patch"),
    (["study", "norms", "test_vit", "--weights", "FILE", "--detect-layer", "6"], "test_vit has 6 blocks"),
    (["patch", "export", "vit_tiny_patch16_224", "--no-pretrained", "--img-size", "8", "--interventions", "{}"],
     "--img-size 8 is smaller than one patch"),
    (["sae", "train", "vit_large_patch16_224", "--no-pretrained", "--hook", "blocks.3.hook_resid_post",
      "--expansion", "128", "--data-shards", "1"], "--expansion 128 on a hook of width 1024"),
    (["sae", "train", "vit_tiny_patch16_224", "--no-pretrained", "--hook", "blocks.3.mlp.hook_post",
      "--expansion", "128", "--data-shards", "1"], "over interp's bound of 67,108,864: give --expansion <= 113"),
])
def test_arguments_the_model_structure_refutes_are_refused_before_it_loads(tmp_path, capsys, monkeypatch, argv,
                                                                           words):
    """Issue 35 #13: a block beyond a timm model's depth, a misspelt hook, an input under one patch were refused
    only after the model's load (random init: 1.3 s for vit_base_patch16_224, 4.2 s for vit_large; a weight file's
    read, longer); now on its skeleton, built on the meta device in ~0.03 s, with the same one line and status 2."""
    from interp.models import sample_image_paths

    argv = [tmp_path / "in.json" if a == "{}" else _test_vit_weights(tmp_path) if a == "FILE" else a for a in argv]
    (tmp_path / "in.json").write_text("[]")
    _forbid_model_builds(monkeypatch)
    images = [] if argv[0] == "patch" else ["--images", str(sample_image_paths()[0])]
    assert main([*map(str, argv), *images, "--out", str(tmp_path / "o")]) == 2
    assert words in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("model, hooks, words", [
    ("vit_tiny_patch16_224", "blocks.99.hook_resid_post",
     "block 99 does not exist, this model has 12 blocks (0-11); last: 'blocks.11.hook_resid_post'"),
    ("pvt_v2_b0", "blocks.99.hook_resid_post", "this model has 8 blocks (stages.0.blocks.0 .. stages.3.blocks.1); "
                                               "last: 'stages.3.blocks.1.hook_resid_post'"),
    ("pvt_v2_b0", "blocks.3.hook_resid_post", "by stage; did you mean 'stages.1.blocks.1.hook_resid_post'?"),
    ("vit_tiny_patch16_224", "blocks.*.hook_nothing", "pattern 'blocks.*.hook_nothing' matches no hook point"),
])
def test_cache_hooks_the_model_lacks_are_refused_on_its_skeleton(tmp_path, capsys, monkeypatch, model, hooks, words):
    """Issue 53: `cache --hooks blocks.99...` was refused only after the full model was built (26 s, 4.17 GB on a
    huge DINOv3), and on PVT said "this model has no blocks"."""
    from interp.models import sample_image_paths

    _forbid_model_builds(monkeypatch)
    argv = ["cache", model, "--no-pretrained", "--images", str(sample_image_paths()[0]), "--hooks", hooks,
            "--out", str(tmp_path / "a.h5")]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("interp: error: --hooks: ") and words in line and len(line) < 200, line
    assert not (tmp_path / "a.h5").exists()


def _hooks_output(argv, capsys) -> str:
    assert main(["hooks", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:weight file 'test_vit.safetensors' holds a 4x4 position grid")
@pytest.mark.parametrize("weights", [False, True])
def test_a_valid_run_gives_what_it_gave_without_a_skeleton(tmp_path, capsys, monkeypatch, weights):
    """The skeleton only refuses earlier: a valid run (random weights, or a file that sets the input size) prints
    the same hooks and shapes as with no skeleton (the check then on the loaded model, as before)."""
    import interp.hooks.load

    argv = ["test_vit", *(["--weights", _test_vit_weights(tmp_path)] if weights else ["--no-pretrained"]),
            "--pattern", "blocks.5.*"]
    with_skeleton = _hooks_output(argv, capsys)
    monkeypatch.setattr(interp.hooks.load, "build_skeleton", lambda *a, **k: pytest.fail("a skeleton was built"))
    monkeypatch.setattr(interp.hooks.load, "load_skeleton", lambda *a, **k: None)
    assert _hooks_output(argv, capsys) == with_skeleton and "blocks.5.mlp.hook_post" in with_skeleton


@pytest.mark.parametrize("valid", [False, True])
def test_a_skeleton_that_cannot_be_built_leaves_the_check_to_the_loaded_model(tmp_path, capsys, monkeypatch, valid):
    """A model timm cannot build on the meta device (or a planted model) runs as before: a valid run is never
    refused for its skeleton, and a bad block number is refused after the load."""
    import interp.hooks.load
    from interp.models import sample_image_paths

    def no_meta(*args, **kwargs):
        raise NotImplementedError("not on the meta device")

    monkeypatch.setattr(interp.hooks.load, "build_skeleton", no_meta)
    if valid:
        assert "blocks.5.hook_resid_post" in _hooks_output(["test_vit", "--no-pretrained"], capsys)
        return
    loads = []
    real = interp.hooks.load.load
    monkeypatch.setattr(interp.hooks.load, "load", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    argv = ["study", "norms", "test_vit", "--no-pretrained", "--detect-layer", "40",
            "--images", str(sample_image_paths()[0]), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "--detect-layer 40 is out of range: test_vit has 6 blocks" in one_error_line(capsys.readouterr().err)
    assert loads == ["test_vit"]


def test_sizes_of_work_are_bounded_before_torch(tmp_path):
    """Issue 53: `ablate --controls 1000000` ran 447 s then raised a raw allocation traceback, `compare`/`reassess
    --img-size 100000` asked for 60 GB, `reassess --top-k 1000000` edited all 4608 neurons, and reassess imported
    torch before refusing `--siblings 1=1` (after 100 s, exit 1): each is one line, exit 2, in a fresh interpreter
    that never imports torch."""
    import subprocess
    import sys

    from interp.models import sample_image_paths

    image = str(sample_image_paths()[0])
    argvs = [
        ["study", "ablate", "planted_vit", "--images", image, "--neurons", "2:1", "--controls", "1000000"],
        ["report", "--controls", "1000000", "--out", str(tmp_path / "r")],
        ["compare", "planted_vit", "--images", image, "--img-size", "100000"],
        ["reassess", "planted_vit", "planted_vit", "--images", image, "--img-size", "224", "100000"],
        ["reassess", "planted_vit", "--images", image, "--top-k", "1000000"],
        ["report", "--top-k", "1000000", "--out", str(tmp_path / "r")],
        ["reassess", "planted_vit", "planted_pvt", "--images", image, "--siblings", "1=1"],
        ["reassess", "planted_vit", "planted_pvt", "planted_swin", "--images", image, "--siblings", "1=2", "3=2"],
    ]
    probe = ("import sys\nfrom interp.cli import main\n"
             f"codes = [main(a) for a in {argvs!r}]\n"
             "print(codes, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip() == f"{[2] * len(argvs)} False", (out.stdout, out.stderr)
    err = out.stderr.strip().splitlines()
    words = ["--controls: expected a whole number 0..100", "--controls: expected a whole number 0..100",
             "--img-size: expected an input size in pixels 1..4096", "--img-size: expected an input size in pixels",
             "--top-k: expected a whole number 1..1024", "--top-k: expected a whole number 1..1024",
             "'1=1' pairs a model with itself or twice", "'3=2' pairs a model with itself or twice"]
    assert len(err) == len(words), err
    for line, word in zip(err, words):
        assert word in line and len(line) < 200, (word, line)


def test_reassess_top_k_beyond_a_models_mlp_is_refused_on_its_skeleton(capsys, monkeypatch):
    from interp.models import sample_image_paths

    _forbid_model_builds(monkeypatch)
    argv = ["reassess", "vit_tiny_patch16_224", "--no-pretrained", "--images", str(sample_image_paths()[0]),
            "--top-k", "500"]
    assert main(argv) == 2
    assert "--top-k 500 is more than half a block's 768 MLP neurons of vit_tiny_patch16_224: give --top-k <= 384" in \
        one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", [["reassess", "planted_vit", "planted_dinov3", "--img-size", "7", "-"],
                                     ["compare", "planted_vit", "planted_dinov3", "--img-size", "7"]])
def test_a_model_set_input_smaller_than_a_patch_is_one_line(capsys, command):
    """Each model of a set is checked as one model is (reassess gave torch's conv traceback before)."""
    assert main(command + ["--no-progress"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--img-size 7 is smaller than one patch of planted_vit" in line, line
