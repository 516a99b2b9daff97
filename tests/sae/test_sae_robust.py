"""``interp sae train`` never loses an SAE and refuses what it cannot do in one line (issue 35): a resume with no
checkpoint over a finished SAE, two runs into one folder, a resume over images whose contents changed, sizes
beyond the data or the bounds, a hook that is not a token activation, an output that is a device node or FIFO,
and a full disk while drawing the training curve."""
from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
from PIL import Image

from conftest import character_device, one_error_line
from interp.cache.lock import WriterLock
from interp.cli import main
from interp.sae import files as sae_files
from sae_helpers import HOOK, needs_overcomplete, planted_cache, planted_sae

pytestmark = needs_overcomplete
SMALL = ["--steps", "2", "--tokens-per-step", "64", "--expansion", "2", "--k", "2", "--window-images", "4",
         "--data-shards", "1", "--holdout", "0", "--checkpoint-every", "1", "--no-progress"]


def _cache_cli(out, *extra):
    return ["sae", "train", "planted_vit", "--cache", str(planted_cache()), "--hook", HOOK, "--out", str(out),
            *SMALL, *extra]


def _finished(tmp_path):
    out = tmp_path / "sae"
    shutil.copytree(planted_sae(), out)
    (out / "checkpoint.pt").unlink(missing_ok=True)
    return out, {p.name: p.read_bytes() for p in out.iterdir()}


def test_resume_without_a_checkpoint_never_replaces_a_finished_sae(tmp_path, capsys, one_thread):
    out, before = _finished(tmp_path)
    assert main(_cache_cli(out, "--k", "4", "--resume")) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "other settings" in line and "k=2" in line and "--overwrite" in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_second_run_into_the_same_folder_is_refused_in_one_line(tmp_path, capsys, one_thread):
    out = tmp_path / "busy"
    out.mkdir()
    with WriterLock(out / "sae.json"):  # the first run holds the folder
        assert main(_cache_cli(out)) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "another interp run" in line and "pid" in line, line
    assert not (out / "sae.json").exists()


def test_resume_over_changed_image_contents_is_refused(tmp_path, capsys, one_thread):
    from interp.models import sample_image_paths

    images = tmp_path / "images"
    images.mkdir()
    for p in sample_image_paths():
        Image.open(p).convert("RGB").resize((64, 64)).save(images / (p.stem + ".png"))
    out = tmp_path / "live"
    live = ["sae", "train", "planted_vit", "--images", str(images), "--hook", HOOK, "--out", str(out), *SMALL]
    live[live.index("--steps") + 1] = "3"
    assert main(live[:live.index("--steps")] + ["--steps", "2"] + live[live.index("--steps") + 2:]) == 0
    assert (out / "checkpoint.pt").exists()
    capsys.readouterr()  # the 2-step run's warnings (a poor SAE) are not the resume's refusal
    first = sorted(images.iterdir())[0]
    Image.new("RGB", (64, 64), (10, 200, 10)).save(first)  # same name, other pixels
    assert main([*live, "--resume"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "other data" in line and "contents_sha256" in line, line


@pytest.mark.parametrize("extra, words", [
    (["--k", "100000"], ["--k 100000", "features"]),
    (["--tokens-per-step", "100000"], ["--tokens-per-step 100000", "training tokens"]),
    (["--tokens-per-step", "10000000"], ["--tokens-per-step"]),
    (["--expansion", "2000"], ["--expansion"]),
    (["--hook", "hook_logits"], ["not a token activation"]),
])
def test_sizes_and_hooks_it_cannot_train_are_refused_with_status_2(tmp_path, capsys, extra, words, one_thread):
    argv = _cache_cli(tmp_path / "x", *extra)
    if extra[0] == "--hook":  # a live run: the cache holds only HOOK
        from interp.models import sample_image_paths

        argv[argv.index("--cache"):argv.index("--cache") + 2] = ["--images", str(sample_image_paths()[0])]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert all(w in line for w in words), line


def test_a_fifo_or_device_link_in_the_run_folder_is_never_replaced(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "sae.json")
    assert main(_cache_cli(out, "--overwrite")) == 2
    assert "FIFO" in one_error_line(capsys.readouterr().err)
    assert os.path.exists(out / "sae.json") and not (out / "sae.json").is_file()
    os.symlink(character_device(), tmp_path / "link")
    assert main(_cache_cli(tmp_path / "link", "--overwrite")) == 2
    assert "character device" in one_error_line(capsys.readouterr().err)


def test_write_atomic_never_replaces_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "sae.json")
    with pytest.raises(Exception) as info:
        sae_files.write_atomic(tmp_path / "sae.json", b"{}", "SAE description")
    assert "not a regular file" in str(info.value) and not (tmp_path / "sae.json").is_file()


def test_a_full_disk_while_drawing_the_curve_is_one_line_and_keeps_the_sae(tmp_path, capsys, monkeypatch,
                                                                           one_thread):
    real = sae_files._write

    def no_room_for_png(path, data):
        if "training_curve" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(sae_files, "_write", no_room_for_png)
    out = tmp_path / "full"
    assert main(_cache_cli(out)) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "training-curve figure" in line and "SAE itself is written" in line, line
    assert json.loads((out / "sae.json").read_text())["hook"] == HOOK


# ------------------------------------------------------------------------------------------ damaged SAE files
def _rewrite(folder, tensors=None, **config_edits):
    """Replace the SAE's tensors and/or sae.json fields, recomputing both checksums (as a deliberate edit would)."""
    from safetensors.torch import load_file, save

    from interp.sae.model import config_digest

    path, cfg_path = folder / "sae.safetensors", folder / "sae.json"
    data = save(tensors(load_file(path))) if tensors else path.read_bytes()
    path.write_bytes(data)
    config = {**json.loads(cfg_path.read_text()), **config_edits}
    config["weights_sha256"] = __import__("hashlib").sha256(data).hexdigest()
    config["config_sha256"] = config_digest(config)
    cfg_path.write_text(json.dumps(config))


def _set(name, make):
    def edit(t):
        t[name] = make(t)
        return t
    return edit


DAMAGE = {
    "0-d scale": (_set("scale", lambda t: t["scale"].reshape(())), "scale []"),
    "3-D w_enc": (_set("w_enc", lambda t: t["w_enc"][None]), "w_enc has shape"),
    "short feature_means": (_set("feature_means", lambda t: t["feature_means"][:5]), "feature_means [5]"),
    "scale 0": (_set("scale", lambda t: t["scale"] * 0), "scale 0"),
    "negative scale": (_set("scale", lambda t: -t["scale"]), "normalisation scale -"),
    "scale 1e-30": (_set("scale", lambda t: t["scale"] * 0 + 1e-30), "scale 1e-30"),
    "int64 dictionary": (_set("dictionary", lambda t: t["dictionary"].long()), "dtype int64"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_sae_tensors_with_a_recomputed_checksum_are_refused(tmp_path, damage, capsys):
    import interp

    folder, _ = _finished(tmp_path)
    edit, words = DAMAGE[damage]
    _rewrite(folder, edit)
    with pytest.raises(interp.errors.InterpError) as info:
        interp.sae.load(folder)
    assert "\n" not in str(info.value) and words in str(info.value), str(info.value)
    # the CLI commands that read an SAE say it in one line too (before: a raw traceback from torch)
    argv = ["study", "ablate", "planted_vit", "--images", str(tmp_path / "none"), "--sae", str(folder),
            "--features", "0", "--mode", "mean", "--out", str(tmp_path / "o")]
    (tmp_path / "none").mkdir()
    Image.new("RGB", (32, 32)).save(tmp_path / "none" / "a.png")
    assert main(argv) == 1
    assert "not a readable SAE" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("edit, words", [
    ({"hook": "blocks.4.hook_resid_post"}, "edited after training"),
    ({"arch": "relu"}, "edited after training"),
    ({"tokens": "bogus"}, "tokens 'bogus'"),
    ({"k": 0}, "k 0"),
    ({"n_features": 7}, "n_features 7"),
])
def test_edits_of_sae_json_are_refused(tmp_path, edit, words):
    import interp

    folder, _ = _finished(tmp_path)
    cfg = folder / "sae.json"
    config = {**json.loads(cfg.read_text()), **edit}
    cfg.write_text(json.dumps(config))  # config_sha256 left as it was: an edit after training
    with pytest.raises(interp.errors.InterpError) as info:
        interp.sae.load(folder)
    assert "\n" not in str(info.value) and words in str(info.value), str(info.value)


def test_a_deeply_nested_sae_json_is_one_line_everywhere(tmp_path, capsys):
    import interp
    from interp.studies.sae.configs import sae_hook

    folder, _ = _finished(tmp_path)
    (folder / "sae.json").write_text("[" * 100000)
    for read in (interp.sae.load, sae_hook):
        with pytest.raises(interp.errors.InterpError):
            read(folder)
    assert main(["report", "--sae", str(folder), "--out", str(tmp_path / "r")]) == 1
    assert "sae.json" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("features", ["58", "12", {"58": 1}, [5.0], [True]])
def test_feature_ids_are_never_coerced(features):
    """The library's own check (the explorer refuses these before, as HTTP 400): "58" was ablated as [5, 8]."""
    import interp
    from interp.interventions import SAEFeatureAblation

    with pytest.raises(ValueError, match="whole feature indices"):
        SAEFeatureAblation(interp.sae.load(planted_sae()), features)


def test_ablating_a_feature_that_never_fires_says_so(tmp_path, one_thread):
    """Before: target = baseline with no word. The feature is one whose mean code on the training tokens is 0."""
    import interp
    from interp.studies import open_source
    from interp.studies.artifacts.ablate import ablate_study
    from interp.studies.artifacts.configs import AblateConfig
    from sae_helpers import planted_images, planted_model

    sae = interp.sae.load(planted_sae())
    silent = int((sae.tensors["feature_means"] == 0).nonzero()[0])
    source = open_source(planted_model(), images=planted_images(4, seed=3))
    with pytest.warns(UserWarning, match=f"feature\\(s\\) {silent} never fire"):
        result = ablate_study(source, AblateConfig(sae=str(planted_sae()), features=[silent], controls=1),
                              progress=False)
    assert result.summary["outlier_count"]["target"] == result.summary["outlier_count"]["baseline"]
    assert result.control_pool["silent_features"] == [silent] and "never fire" in result.notes[0]


def test_coinciding_control_sets_are_said():
    from interp.studies.artifacts.ablate import ablation_notes

    same = [{"features": [3, 5]}] * 5
    assert "only 1 distinct" in ablation_notes(same, [])[0]
    assert ablation_notes([{"features": [3, 5]}, {"features": [4, 5]}], []) == []
    assert ablation_notes([{"2": [1, 7]}, {"2": [7, 1]}], [])  # neuron sets: the same set in another order


def test_a_dead_torchrun_peer_is_one_line_on_the_survivor(monkeypatch):
    """torchrun rank 0 whose peer died raised a raw gloo traceback; a RuntimeError of another kind stays a bug."""
    import torch.distributed as dist

    from interp.commands.sae import peer_lost

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    error = peer_lost(dist.DistError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1"))
    assert "another process of this torchrun run stopped" in str(error) and "--resume" in str(error)
    assert peer_lost(RuntimeError("Connection reset by peer")) is not None
    assert peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert peer_lost(dist.DistError("Connection closed by peer")) is None


def test_reading_a_poor_sae_warns(tmp_path):
    """An SAE with held-out explained variance -1.36 was read by every study without a word."""
    import interp

    folder, _ = _finished(tmp_path)
    config = json.loads((folder / "sae.json").read_text())
    config["metrics"]["held_out"]["explained_variance"] = -1.356
    config.pop("warnings", None)  # an SAE trained before training recorded its warnings: the metric speaks
    from interp.sae.model import config_digest

    config["config_sha256"] = config_digest(config)  # metrics are not decisive: no digest change needed
    (folder / "sae.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="explained variance -1.356 < 0.5"):
        interp.sae.load(folder)
