"""Fault battery of SAE training and loading: kill -9 then --resume, a full disk, malformed files, an SAE for
another hook or model. Nothing already written is lost; every refusal is one line."""
from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import time

import pytest
import torch

import interp
from conftest import make_model
from forked import Forked
from forked import cli as forked_cli
from interp.cli import main
from interp.errors import InterpError
from interp.interventions import SAEFeatureAblation
from interp.sae import files as sae_files
from interp.sae_settings import SAE_CHECKPOINT
from sae_helpers import HOOK, TRAIN, needs_overcomplete, planted_cache, planted_model, planted_sae, train_planted

pytestmark = needs_overcomplete
STEPS, EVERY = 48, 3
ARGS = ["--steps", str(STEPS), "--tokens-per-step", "256", "--expansion", "2", "--k", "2", "--lr", "3e-3",
        "--window-images", "16", "--data-shards", "2", "--holdout", "0.125", "--dead-window", "100",
        "--checkpoint-every", str(EVERY)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("sae") / "ref"
    train_planted(out, steps=STEPS, checkpoint_every=EVERY)
    return interp.sae.load(out)


def _same(a, b):
    for name in ("w_enc", "b_enc", "dictionary", "feature_means"):
        assert torch.allclose(a.tensors[name], b.tensors[name], atol=1e-5), name
    assert a.config["curve"]["loss"] == pytest.approx(b.config["curve"]["loss"], rel=1e-4)


def _train_cli(out, *extra):
    return ["sae", "train", "planted_vit", "--cache", str(planted_cache()), "--hook", HOOK, "--out", str(out),
            *ARGS, *extra]


def test_kill_9_at_a_random_step_then_resume_ends_equal(tmp_path, uninterrupted, one_thread, capsys):
    out = tmp_path / "run"
    target = random.randrange(EVERY, STEPS // 2, EVERY)  # kill once this step is checkpointed
    with Forked(forked_cli, *_train_cli(out), "--no-progress", capture=True) as child:
        deadline, seen = time.monotonic() + 240, None  # a safety net, never a timing assertion
        while child.poll() is None and time.monotonic() < deadline:
            path = out / "checkpoint.pt"
            stamp = path.stat().st_mtime_ns if path.exists() else None
            if stamp != seen and torch.load(path, weights_only=False)["step"] >= target:
                break
            seen = stamp
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate()
    assert child.returncode == -signal.SIGKILL, err[-1000:]
    state = torch.load(out / "checkpoint.pt", weights_only=False)  # whole: written through a rename
    assert target <= state["step"] < STEPS and state["step"] % EVERY == 0
    assert main(_train_cli(out, "--resume")) == 0, capsys.readouterr().err
    _same(interp.sae.load(out), uninterrupted)


def test_full_disk_keeps_the_last_checkpoint_and_resume_ends_equal(tmp_path, uninterrupted, one_thread,
                                                                   monkeypatch, capsys):
    out = tmp_path / "full"
    real, calls = sae_files._write, []

    def filling_disk(path, data):
        calls.append(path)
        if len(calls) > 2:  # room for two checkpoints, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(sae_files, "_write", filling_disk)
    assert main(_train_cli(out)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "previous file is kept" in err, err
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 2 * EVERY
    assert not (out / "sae.json").exists() and not list(out.glob("*.tmp"))
    monkeypatch.setattr(sae_files, "_write", real)
    assert main(_train_cli(out, "--resume")) == 0
    _same(interp.sae.load(out), uninterrupted)


def _copy(tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(planted_sae(), dst)
    return dst


def _one_line_refusal(call, *words):
    with pytest.raises(InterpError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


@pytest.mark.parametrize("damage", ["truncated json", "not an object", "no hook", "newer version", "unknown arch",
                                    "flipped weight byte", "truncated weights", "missing weights"])
def test_malformed_files_are_refused_in_one_line(tmp_path, damage):
    d = _copy(tmp_path)
    cfg, weights = d / "sae.json", d / "sae.safetensors"
    config = json.loads(cfg.read_text())
    if damage == "truncated json":
        cfg.write_text(cfg.read_text()[:100])
    elif damage == "not an object":
        cfg.write_text("[1, 2]")
    elif damage == "no hook":
        cfg.write_text(json.dumps({k: v for k, v in config.items() if k != "hook"}))
    elif damage == "newer version":
        cfg.write_text(json.dumps({**config, "version": 99}))
    elif damage == "unknown arch":
        cfg.write_text(json.dumps({**config, "arch": "gated"}))
    elif damage == "flipped weight byte":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:200])
    else:
        weights.unlink()
    _one_line_refusal(lambda: interp.sae.load(d), str(d))


def test_an_sae_for_another_hook_model_or_width_is_refused(tmp_path):
    sae = interp.sae.load(planted_sae())
    _one_line_refusal(lambda: interp.sae.load(planted_sae(), hook="blocks.4.hook_resid_post"), HOOK, "--hook")
    other = make_model("vit")
    _one_line_refusal(lambda: interp.sae.load(planted_sae(), model=other), "planted_vit", "another architecture")
    _one_line_refusal(lambda: sae.check_hook(HOOK, 384), "width 192")
    _one_line_refusal(lambda: sae.encode(torch.zeros(2, 384)), "width 192")
    with pytest.raises(InterpError, match="blocks 0..1"):
        with other.intervene(SAEFeatureAblation(sae, [0])):  # block 3 does not exist in a 2-block model
            pass


def test_a_cache_without_the_hook_is_refused_in_one_line(tmp_path, capsys):
    rc = main(["sae", "train", "planted_vit", "--cache", str(planted_cache()), "--hook", "blocks.1.hook_resid_post",
               "--out", str(tmp_path / "x"), "--steps", "2"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "blocks.1.hook_resid_post" in err and "interp cache" in err, err


def test_resume_with_the_cache_named_relatively_continues(tmp_path, one_thread, monkeypatch):
    """Issue 53: --resume refused the same cache spelled as a relative path instead of the absolute one the run
    began with ("trained on other data"); the paths are compared resolved."""
    out = tmp_path / "run"
    train_planted(out, steps=4, checkpoint_every=2)
    (out / "sae.json").unlink()
    monkeypatch.chdir(planted_cache().parent.parent)
    relative = os.path.join(planted_cache().parent.name, planted_cache().name)
    result = interp.sae.train(planted_model(), HOOK, out, cache=relative, progress=False, resume=True,
                              checkpoint_every=2, **{**TRAIN, "steps": 6})
    assert len(result["curve"]["step"]) == 6 and result["data"]["path"] == str(planted_cache().resolve())


def test_resume_with_other_settings_is_refused(tmp_path, one_thread):
    out = tmp_path / "run"
    train_planted(out, steps=4, checkpoint_every=2)
    (out / "sae.json").unlink()
    _one_line_refusal(lambda: train_planted(out, steps=6, checkpoint_every=2, resume=True, k=3), "k=2", "--overwrite")


def test_a_checkpoint_written_before_tokens_per_step_was_named_resumes(tmp_path, one_thread):
    """Checkpoints recorded the tokens per step as ``batch_size`` until that name went to the images per forward."""
    out = tmp_path / "run"
    train_planted(out, steps=4, checkpoint_every=2)
    (out / "sae.json").unlink()
    path = out / SAE_CHECKPOINT
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["settings"]["batch_size"] = state["settings"].pop("tokens_per_step")
    torch.save(state, path)
    train_planted(out, steps=6, checkpoint_every=2, resume=True)
    assert (out / "sae.json").is_file()
