"""`interp sae import` as a writer and a reader of other projects' files (issue 53): the output policy of every
SAE writer (lock, --overwrite, staged replace), no input that can block or never end, one line for files of the
wrong shape or type, and never an SAE its own loader refuses."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

import interp
from conftest import character_device, one_error_line
from interp.cache.lock import WriterLock
from interp.cli import main
from interp.errors import InterpError, UsageError
from interp.sae import foreign
from reference import foreign_sae as ref
from sae_helpers import HOOK, planted_model

D, N = 192, 384


def _import(fmt, source, out, *extra) -> list:
    return ["sae", "import", "planted_vit", fmt, str(source), "--out", str(out), *extra]


def _trained_folder(folder: Path) -> dict:
    """A folder as `sae train` leaves it: sae.json, sae.safetensors, training_curve.png, checkpoint.pt."""
    source = ref.write_saelens(folder.parent / "src-old", ref.random_weights(D, N, 7), "standard", HOOK)
    assert main(_import("saelens", source, folder)) == 0
    (folder / "training_curve.png").write_bytes(b"png")
    (folder / "checkpoint.pt").write_bytes(b"ckpt")
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_import_onto_an_sae_folder_obeys_the_output_policy(tmp_path, capsys):
    """It replaced sae.json and sae.safetensors of a trained SAE without --overwrite or the lock, and left the
    old training_curve.png beside the import. Now: refused without --overwrite, refused while another run holds
    the folder's lock, and with --overwrite the whole previous run is replaced (its curve and checkpoint too)."""
    out = tmp_path / "sae"
    before = _trained_folder(out)
    capsys.readouterr()
    new = ref.write_saelens(tmp_path / "src-new", ref.random_weights(D, N, 8), "standard", HOOK)
    assert main(_import("saelens", new, out)) == 1
    assert "already holds an SAE run" in one_error_line(capsys.readouterr().err)
    held = WriterLock(out / "sae.json").acquire()  # a training run writes into out
    try:
        assert main(_import("saelens", new, out, "--overwrite")) == 1
        assert "being written by another interp run" in one_error_line(capsys.readouterr().err)
    finally:
        held.release()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.suffix != ".lock"} == before
    assert main(_import("saelens", new, out, "--overwrite")) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".lock")) == ["sae.json", "sae.safetensors"]
    sae = interp.sae.load(out, model=planted_model())
    assert torch.equal(sae.tensors["dictionary"], ref.random_weights(D, N, 8)["W_dec"])


@pytest.mark.parametrize("where, words", [("file", "is a file"), ("/dev/null", "is a character device"),
                                          ("/proc", "cannot create a file in '/proc'")])
def test_import_out_that_cannot_be_an_sae_folder_is_one_line_before_torch(tmp_path, capsys, where, words):
    (tmp_path / "f").write_text("mine")
    source = ref.write_saelens(tmp_path / "src", ref.random_weights(D, N), "standard", HOOK)
    assert main(_import("saelens", source, tmp_path / "f" if where == "file" else where)) == 2
    assert words in one_error_line(capsys.readouterr().err)
    assert (tmp_path / "f").read_text() == "mine"


def _fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


def test_inputs_that_block_or_never_end_are_refused_before_they_are_opened(tmp_path):
    """A FIFO as cfg.json, the weights or ViT-Prisma's .pt blocked forever; a link to /dev/zero as cfg.json read
    until the kernel killed the process; a cfg.json of megabytes is no configuration."""
    model, w = planted_model(), ref.random_weights(D, N)
    cases = []
    for name in ("cfg.json", "sae_weights.safetensors"):
        folder = ref.write_saelens(tmp_path / f"sl-{name}", w, "standard", HOOK)
        cases.append(("saelens", folder, _fifo(folder / name), "FIFO"))
    folder = ref.write_saelens(tmp_path / "sl-zero", w, "standard", HOOK)
    (folder / "cfg.json").unlink()
    (folder / "cfg.json").symlink_to(character_device())
    cases.append(("saelens", folder, folder / "cfg.json", "character device"))
    folder = ref.write_saelens(tmp_path / "sl-big", w, "standard", HOOK)
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "pad": "x" * (2 << 20)}))
    cases.append(("saelens", folder, folder / "cfg.json", "larger than 1,048,576 bytes"))
    weights = ref.write_vit_prisma(tmp_path / "prisma", w, 3)
    cases.append(("vit_prisma", weights.parent, _fifo(weights), "FIFO"))
    folder = ref.write_vit_prisma(tmp_path / "prisma-cfg", w, 3).parent
    cases.append(("vit_prisma", folder, _fifo(folder / "config.json"), "FIFO"))
    saev = _fifo(tmp_path / "saev.pt")
    cases.append(("saev", saev, saev, "FIFO"))
    for fmt, source, path, words in cases:
        with pytest.raises(UsageError, match=re.escape(words)) as e:
            foreign.convert(fmt, source, model, hook=HOOK)
        assert str(path) in str(e.value) and "\n" not in str(e.value), (fmt, path)


def _saelens_with(tmp_path, name, cfg_edit=None, tensors_edit=None, architecture="standard"):
    w = ref.random_weights(D, N, 1, threshold=architecture == "jumprelu")
    w.update(tensors_edit or {})
    folder = ref.write_saelens(tmp_path / name, w, architecture, HOOK)
    if cfg_edit:
        cfg = json.loads((folder / "cfg.json").read_text())
        (folder / "cfg.json").write_text(json.dumps({**cfg, **cfg_edit}))
    return folder


@pytest.mark.parametrize("cfg_edit, tensors_edit, architecture, words", [
    ({"architecture": 5}, None, "standard", "architecture is 5, not a string"),
    ({"metadata": {"hook_name": 3}}, None, "standard", "hook_name is 3, not a string or null"),
    ({"metadata": ["x"]}, None, "standard", "metadata is [\"x\"], not an object or null"),
    ({"apply_b_dec_to_input": "yes"}, None, "standard", "apply_b_dec_to_input is \"yes\""),
    ({"k": "8"}, None, "topk", "k is \"8\", not a whole number or null"),
    ({"k": True}, None, "topk", "k is true, not a whole number"),
    ({"k": 0}, None, "topk", "loader would refuse it: k 0"),
    ({"k": -3}, None, "topk", "loader would refuse it: k -3"),
    ({"k": 10 ** 6}, None, "topk", "loader would refuse it: k 1000000"),
    (None, {"W_enc": torch.zeros(D, N, 2)}, "standard", "W_enc has shape [192, 384, 2], not [d, n_features]"),
    (None, {"W_dec": torch.full((N, D), float("nan"))}, "standard", "loader would refuse it: non-finite weights"),
    (None, {"b_enc": torch.tensor([float("inf")] * N)}, "standard", "non-finite weights"),
    (None, {"threshold": torch.zeros(3)}, "jumprelu", "threshold [3] (expected [384])"),
    (None, {"b_dec": torch.zeros(D, dtype=torch.int64)}, "standard", "b_dec (int64) are not floating point"),
])
def test_files_of_the_wrong_type_or_that_the_loader_refuses_are_one_line_and_nothing_is_written(
        tmp_path, capsys, cfg_edit, tensors_edit, architecture, words):
    """Fields of the wrong JSON type, a non-string hook, a W_enc that is not 2-D gave raw tracebacks; NaN / inf
    weights, k <= 0, k = true and a mis-shaped threshold were written as SAEs the loader then refused."""
    source = _saelens_with(tmp_path, "src", cfg_edit, tensors_edit, architecture)
    with pytest.raises(UsageError, match=re.escape(words)) as e:
        foreign.convert("saelens", source, planted_model())
    assert "\n" not in str(e.value) and len(str(e.value)) < 300
    if words == "non-finite weights":  # the command line: exit 2, one line, no folder left
        assert main(_import("saelens", source, tmp_path / "out")) == 2
        assert words in one_error_line(capsys.readouterr().err)
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("state", [[1, 2], {"W_enc": [[1.0]]}, {3: torch.zeros(1)}, torch.zeros(2)])
def test_a_saev_state_that_is_not_named_tensors_is_one_line(tmp_path, state):
    header = {"schema": 5, "cfg": {"d_model": D, "d_sae": N, "activation": {"cls": "Relu", "params": {}}}}
    with open(tmp_path / "s.pt", "wb") as fd:
        fd.write((json.dumps(header) + "\n").encode())
        torch.save(state, fd)
    with pytest.raises(UsageError, match="not a state dict of named tensors|not a readable SAE file"):
        foreign.convert("saev", tmp_path / "s.pt", planted_model(), hook=HOOK)


def test_a_description_without_its_checksum_is_refused(tmp_path):
    """An edited sae.json (k, arch, tokens, high_norm) whose config_sha256 was deleted was used as it said."""
    source = ref.write_saelens(tmp_path / "src", ref.random_weights(D, N), "topk", HOOK, k=8)
    out = tmp_path / "sae"
    out.mkdir()
    interp.sae.model.save(out, *foreign.convert("saelens", source, planted_model()))
    config = json.loads((out / "sae.json").read_text())
    for edit in ({"k": 4}, {"tokens": "all"}, {"high_norm": "exclude"}, {"arch": "relu", "k": None}, {}):
        (out / "sae.json").write_text(json.dumps({k: v for k, v in {**config, **edit}.items()
                                                  if k != "config_sha256"}))
        with pytest.raises(InterpError, match="has no config_sha256.*train it again") as e:
            interp.sae.load(out)
        assert "\n" not in str(e.value)
