"""``interp sae train`` / ``interp.sae.train``: overcomplete's arithmetic, the streamed data, the files, DDP."""
from __future__ import annotations

import json
import os
import socket
import sys

import numpy as np
import pytest
import torch

import interp
from interp.cli import main
from interp.errors import InterpError
from interp.interventions.sae_features import ARCHS, SparseCodes
from interp.sae import modules as sae_modules
from interp.sae.data import TokenStream, token_mask
from interp.sae.setup import prepare_data
from interp.sae.train import TrainSettings
from sae_helpers import HOOK, TRAIN, needs_overcomplete, planted_cache, planted_images, planted_model, train_planted
from forked import Forked
from forked import cli as forked_cli

pytestmark = needs_overcomplete


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_encoder_gives_overcomplete_codes(arch, one_thread):
    """SparseCodes (used by load, features and the ablation) = the overcomplete module's encode, normalisation
    undone, after a few training steps (BatchTopK's running threshold and JumpReLU's thresholds set)."""
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    module = sae_modules.build(arch, 16, 32, 4, 64, points=x[:20].clone())
    criterion = sae_modules.criterion(arch, 0.1, 1e-3)
    optimiser = torch.optim.Adam(module.parameters(), 1e-2)
    for _ in range(3):
        optimiser.zero_grad()
        pre, codes, x_hat = module(x)
        criterion(x, x_hat, pre, codes, module.get_dictionary()).backward()
        optimiser.step()
    tensors = sae_modules.encoder_tensors(module, arch)
    mean, scale = torch.randn(16), 3.0
    plain = SparseCodes(arch, {**tensors, "mean": mean, "scale": torch.tensor([scale])}, 4)
    module.eval()
    expected = module.encode(x)[1]
    assert torch.allclose(plain(mean + scale * x), expected, atol=1e-5)
    assert torch.allclose(tensors["dictionary"], module.get_dictionary(), atol=0)


def test_same_loss_curve_as_overcompletes_own_loop(tmp_path, one_thread, capsys):
    """The same batches, arch and seed: overcomplete's train_sae on an in-memory tensor and interp's streaming loop
    give the same loss at every step."""
    from overcomplete.sae.train import train_sae

    settings = {**TRAIN, "steps": 12}
    result = train_planted(tmp_path / "ours", **settings)
    cfg = TrainSettings(**settings)
    data = prepare_data(planted_model(), HOOK, cfg, cache=planted_cache())
    stream = TokenStream(data.train, data.counts[data.train], data.read_tokens, cfg.seed, cfg.window_images,
                         cfg.batch_size, cfg.data_shards, range(cfg.data_shards))
    tokens = torch.cat([data.norm.apply(stream.batch(t)) for t in range(cfg.steps)])  # in memory
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=cfg.batch_size)
    torch.manual_seed(cfg.seed)
    module = sae_modules.build(cfg.arch, data.rows.d, cfg.expansion * data.rows.d, cfg.k, cfg.batch_size)
    logs = train_sae(module, loader, sae_modules.criterion(cfg.arch, cfg.aux_penalty, cfg.l1_penalty),
                     torch.optim.Adam(module.parameters(), lr=cfg.lr), nb_epochs=1, clip_grad=cfg.clip_grad)
    capsys.readouterr()
    assert np.allclose(logs["step_loss"], result["curve"]["loss"], rtol=1e-4, atol=1e-9)
    ours = interp.sae.load(tmp_path / "ours").tensors["dictionary"]
    module.eval()
    assert torch.allclose(ours, module.get_dictionary(), atol=1e-5)


def test_cli_writes_the_sae_the_figure_and_a_described_run(tmp_path, one_thread, capsys):
    out = tmp_path / "run"
    rc = main(["sae", "train", "planted_vit", "--cache", str(planted_cache()), "--hook", HOOK, "--out", str(out),
               "--steps", "12", "--batch-size", "256", "--expansion", "2", "--k", "2", "--data-shards", "2",
               "--window-images", "16", "--lr", "3e-3", "--tokens", "all", "--high-norm", "exclude"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert {"sae.safetensors", "sae.json", "training_curve.png"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "sae.json").read_text())
    assert config["model"]["model_name"] == "planted_vit" and config["hook"] == HOOK
    assert config["tokens"] == "all" and config["high_norm"] == "exclude" and config["detection"]["artifacts_found"]
    assert len(config["curve"]["loss"]) == 12 and config["metrics"]["held_out"]["l0"] <= 2
    sae = interp.sae.load(out, model=planted_model(), hook=HOOK)
    assert sae.directions.shape == (384, 192)
    x = torch.from_numpy(interp.cache.open(planted_cache())[HOOK][:2])
    codes = sae.encode(x)
    assert torch.allclose(sae.decode(codes), sae.mean + codes @ sae.directions, atol=1e-3)  # hook units
    assert main(["sae", "train", "planted_vit", "--cache", str(planted_cache()), "--hook", HOOK,
                 "--out", str(out), "--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and "--overwrite" in err


def test_token_choice_follows_the_detection():
    kinds = np.array([0, 2, 2, 2])
    outliers = np.array([[True, False, False], [False, False, True]])
    assert token_mask(kinds, "patches", "only", outliers, 2).tolist() == [[0, 1, 0, 0], [0, 0, 0, 1]]
    assert token_mask(kinds, "all", "exclude", outliers, 2).tolist() == [[1, 0, 1, 1], [1, 1, 1, 0]]
    assert token_mask(kinds, "cls", "include", None, 2).tolist() == [[1, 0, 0, 0]] * 2
    with pytest.raises(InterpError, match="registers"):
        token_mask(kinds, "registers", "include", None, 2)
    with pytest.raises(InterpError, match="does not apply"):
        token_mask(kinds, "cls", "only", outliers, 2)


def test_live_from_the_model_equals_the_cache(tmp_path, one_thread):
    images = planted_images(8, seed=9)
    path = tmp_path / "small.h5"
    model = planted_model()
    interp.cache.write(model, images, hooks=HOOK, path=path, progress=False, dtype="float32")
    settings = dict(TRAIN, steps=4, holdout=0.25, window_images=4)
    cached = interp.sae.train(model, HOOK, tmp_path / "c", cache=path, progress=False, **settings)
    live = interp.sae.train(model, HOOK, tmp_path / "l", images=images, progress=False, **settings)
    assert np.allclose(cached["curve"]["loss"], live["curve"]["loss"], rtol=1e-4)
    assert cached["detection"]["n_above"] == live["detection"]["n_above"]


def test_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "overcomplete", None)
    monkeypatch.setitem(sys.modules, "overcomplete.sae", None)
    rc = main(["sae", "train", "planted_vit", "--cache", str(planted_cache()), "--hook", HOOK,
               "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "pip install 'interp[sae]'" in err


def test_two_ddp_ranks_equal_one_process(tmp_path):
    """DDP on 2 CPU processes (gloo), each reading its own data shards, ends with the one-process weights. The
    ranks are forked with the environment torchrun gives its workers (the launcher itself is run by the
    cache's sharded test)."""
    settings = dict(TRAIN, steps=6)
    one = tmp_path / "one"
    train_planted(one, **settings)
    two = tmp_path / "two"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def as_rank(rank):
        def environment():
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        return environment

    argv = ["sae", "train", "planted_vit", "--cache", planted_cache(), "--hook", HOOK, "--out", two, "--steps", "6",
            "--batch-size", "256", "--expansion", "2", "--k", "2", "--lr", "3e-3", "--window-images", "16",
            "--data-shards", "2", "--holdout", "0.125", "--dead-window", "100", "--no-progress"]
    ranks = [Forked(forked_cli, *argv, capture=True, before=as_rank(rank)) for rank in range(2)]
    for rank in ranks:
        with rank:
            _, err = rank.communicate()
            assert rank.returncode == 0, err[-2000:]
    a, b = interp.sae.load(one), interp.sae.load(two)
    assert (a.config["processes"], b.config["processes"]) == (1, 2)
    for name in ("w_enc", "b_enc", "dictionary"):
        assert torch.allclose(a.tensors[name], b.tensors[name], atol=1e-5), name
    assert np.allclose(a.config["curve"]["loss"], b.config["curve"]["loss"], rtol=1e-4)
