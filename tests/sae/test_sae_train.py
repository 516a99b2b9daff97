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
from interp.interventions.sae_features import ARCHS, CODE_RULES, SparseCodes
from interp.sae import modules as sae_modules
from interp.sae.data import TokenStream, token_mask
from interp.sae.evaluate import loss_recovered
from interp.sae.setup import prepare_data
from interp.sae.train import TrainSettings, dead_mask
from sae_helpers import HOOK, TRAIN, needs_overcomplete, planted_cache, planted_images, planted_model, train_planted
import fresh_interpreter
from forked import Forked
from forked import cli as forked_cli

pytestmark = needs_overcomplete


def _settings(**overrides):
    return TrainSettings(**{**TRAIN, **overrides})


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_encoder_gives_overcomplete_codes(arch, one_thread):
    """SparseCodes (used by load, features and the ablation) = the overcomplete module's encode, normalisation
    undone, after a few training steps with the architecture's own loss (BatchTopK's running threshold and
    JumpReLU's thresholds set)."""
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    cls = sae_modules.architecture(arch)
    owner = cls(_settings(arch=arch, k=4))
    module = owner.build(16, 32, 64, points=x[:20].clone())
    optimiser = torch.optim.Adam(module.parameters(), 1e-2)
    for step in range(3):
        optimiser.zero_grad()
        pre, codes, x_hat = module(x)
        dead = torch.arange(32) % 2 == step % 2
        owner.loss(x, pre, codes, x_hat, module, module.get_dictionary(), dead)[0].backward()
        optimiser.step()
    tensors = sae_modules.encoder_tensors(module, owner)
    mean, scale = torch.randn(16), 3.0
    plain = SparseCodes(cls.codes, {**tensors, "mean": mean, "scale": torch.tensor([scale])}, owner.k)
    module.eval()
    expected = module.encode(x)[1]
    assert torch.allclose(plain(mean + scale * x), expected, atol=1e-5)
    assert torch.allclose(tensors["dictionary"], module.get_dictionary(), atol=0)


def test_the_registry_is_the_cli_choices():
    assert tuple(sae_modules.ARCHITECTURES) == tuple(ARCHS)
    for name, cls in sae_modules.ARCHITECTURES.items():
        assert cls.name == name and cls.codes in CODE_RULES


def _batch(n, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g)


@pytest.mark.parametrize("arch", ["relu", "jumprelu"])
def test_sparsity_term_is_per_token_whatever_the_batch(arch, one_thread):
    """The loss of a batch and of the same batch repeated 4 times are equal: every term is a mean over tokens (the
    summed L1 of before grew with the batch: 4x here)."""
    torch.manual_seed(0)
    owner = sae_modules.architecture(arch)(_settings(arch=arch))
    module = owner.build(16, 32, 64, None)
    x = _batch(64)
    one = owner.loss(x, *_forward(module, x), module, module.get_dictionary(), torch.zeros(32, dtype=bool))
    x4 = x.repeat(4, 1)
    four = owner.loss(x4, *_forward(module, x4), module, module.get_dictionary(), torch.zeros(32, dtype=bool))
    assert float(one[1]["sparsity"].detach()) > 0
    assert float(four[0].detach()) == pytest.approx(float(one[0].detach()), rel=1e-5)
    assert float(four[1]["sparsity"].detach()) == pytest.approx(float(one[1]["sparsity"].detach()), rel=1e-5)


def _forward(module, x):
    pre, codes, x_hat = module(x)
    return pre, codes, x_hat


def test_relu_loss_is_mse_plus_l1_per_token(one_thread):
    torch.manual_seed(0)
    owner = sae_modules.architecture("relu")(_settings(arch="relu", l1_penalty=0.3))
    module = owner.build(16, 32, 64, None)
    x = _batch(64)
    pre, codes, x_hat = module(x)
    total, parts = owner.loss(x, pre, codes, x_hat, module, module.get_dictionary(), torch.zeros(32, dtype=bool))
    mse = ((x - x_hat) ** 2).sum(1).mean()
    l1 = (codes * module.get_dictionary().norm(dim=1)).sum(1).mean()
    assert float(parts["mse"]) == pytest.approx(float(mse), rel=1e-6)
    assert float(total) == pytest.approx(float(mse + 0.3 * l1), rel=1e-6)


def test_jumprelu_l0_term_counts_active_features_and_moves_the_thresholds(one_thread):
    """The L0 term is l0_penalty x the mean count of codes above threshold, and its straight-through gradient
    reaches the thresholds (rectangle kernel): raising the penalty raises them (Rajamanoharan et al. 2024)."""
    torch.manual_seed(0)
    owner = sae_modules.architecture("jumprelu")(_settings(arch="jumprelu", l0_penalty=0.5))
    module = owner.build(16, 32, 64, None)
    x = _batch(256)
    with torch.no_grad():  # put every threshold inside the band of some pre-activations
        module.thresholds.fill_(float(torch.log(torch.relu(module.encode(x)[0]).median() + 1e-3)))
    pre, codes, x_hat = module(x)
    total, parts = owner.loss(x, pre, codes, x_hat, module, module.get_dictionary(), torch.zeros(32, dtype=bool))
    count = (torch.relu(pre) > torch.exp(module.thresholds)).float().sum(1).mean()
    assert float(parts["sparsity"]) == pytest.approx(0.5 * float(count), rel=1e-6)
    module.zero_grad()
    parts["sparsity"].backward()
    assert module.thresholds.grad is not None and float(module.thresholds.grad.sum()) < 0  # descent raises them


def test_auxk_reconstructs_the_detached_residual_with_dead_features_only(one_thread):
    """AuxK (Gao et al. 2024): 0 with no dead feature; with dead ones, the k_aux largest positive pre-activations
    among them reconstruct the residual, whose gradient does not reach x_hat; alive features get no gradient."""
    torch.manual_seed(0)
    x, d, n = _batch(32), 16, 32
    dictionary = torch.nn.functional.normalize(torch.randn(n, d), dim=1).requires_grad_(True)
    pre = torch.randn(32, n, requires_grad=True)
    x_hat = (0.5 * x).requires_grad_(True)
    none = torch.zeros(n, dtype=torch.bool)
    assert float(sae_modules.auxk_loss(x, x_hat, pre, dictionary, none, 4)) == 0.0
    dead = torch.arange(n) >= 24
    loss = sae_modules.auxk_loss(x, x_hat, pre, dictionary, dead, 4)
    relu = torch.relu(pre.detach()) * dead
    top = relu.topk(4, dim=1)
    z = torch.zeros_like(relu).scatter(1, top.indices, top.values)
    e = x - x_hat.detach()
    expected = ((e - z @ dictionary.detach()) ** 2).sum() / (e ** 2).sum()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    loss.backward()
    assert x_hat.grad is None or float(x_hat.grad.abs().sum()) == 0.0
    assert float(pre.grad[:, :24].abs().sum()) == 0.0 and float(pre.grad[:, 24:].abs().sum()) > 0


def test_dead_counts_features_that_never_fired():
    """A feature that never fired is dead from step 1 (it counted alive until dead_window steps before)."""
    last = torch.tensor([0, 1, 5, 50])
    assert dead_mask(last, 50, 200).tolist() == [True, False, False, False]
    assert dead_mask(last, 205, 200).tolist() == [True, True, True, False]


def test_same_loss_curve_as_overcompletes_own_loop(tmp_path, one_thread, capsys):
    """The same batches, arch and seed: overcomplete's train_sae on an in-memory tensor (given the relu
    architecture's loss) and interp's streaming loop give the same loss at every step: the loop's arithmetic
    (forward, backward, clipping, Adam) is train_sae's."""
    train_sae = sae_modules.overcomplete().train_sae

    settings = {**TRAIN, "steps": 12, "arch": "relu"}
    result = train_planted(tmp_path / "ours", **settings)
    cfg = TrainSettings(**settings)
    data = prepare_data(planted_model(), HOOK, cfg, cache=planted_cache())
    stream = TokenStream(data.train, data.counts[data.train], data.read_tokens, cfg.seed, cfg.window_images,
                         cfg.tokens_per_step, cfg.data_shards, range(cfg.data_shards))
    tokens = torch.cat([data.norm.apply(stream.batch(t)) for t in range(cfg.steps)])  # in memory
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=cfg.tokens_per_step)
    torch.manual_seed(cfg.seed)
    owner = sae_modules.architecture(cfg.arch)(cfg)
    module = owner.build(data.rows.d, cfg.expansion * data.rows.d, cfg.tokens_per_step, None)
    none = torch.zeros(cfg.expansion * data.rows.d, dtype=torch.bool)

    def criterion(x, x_hat, pre, codes, dictionary):
        return owner.loss(x, pre, codes, x_hat, module, dictionary, none)[0]

    logs = train_sae(module, loader, criterion, torch.optim.Adam(module.parameters(), lr=cfg.lr), nb_epochs=1,
                     clip_grad=cfg.clip_grad)
    capsys.readouterr()
    assert np.allclose(logs["step_loss"], result["curve"]["loss"], rtol=1e-4, atol=1e-9)
    ours = interp.sae.load(tmp_path / "ours").tensors["dictionary"]
    module.eval()
    assert torch.allclose(ours, module.get_dictionary(), atol=1e-5)


def test_cli_writes_the_sae_the_figure_and_a_described_run(tmp_path, one_thread, capsys):
    out = tmp_path / "run"
    rc = main(["sae", "train", "planted_vit", "--cache", str(planted_cache()), "--hook", HOOK, "--out", str(out),
               "--steps", "12", "--tokens-per-step", "256", "--expansion", "2", "--k", "2", "--data-shards", "2",
               "--window-images", "16", "--lr", "3e-3", "--tokens", "all", "--high-norm", "exclude"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert {"sae.safetensors", "sae.json", "training_curve.png"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "sae.json").read_text())
    assert config["model"]["model_name"] == "planted_vit" and config["hook"] == HOOK
    assert config["tokens"] == "all" and config["high_norm"] == "exclude" and config["detection"]["artifacts_found"]
    assert len(config["curve"]["loss"]) == 12 and config["metrics"]["held_out"]["l0"] <= 2
    assert config["warnings"] and all(f"warning: {w}" in captured.err for w in config["warnings"])  # 12 steps
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
    # loss recovered on the held-out images: a live run has them; a cache written from tensors does not
    measured = live["metrics"]["held_out"]["loss_recovered"]
    held = np.sort(np.random.default_rng([TRAIN.get("seed", 0), 7]).permutation(8)[:2])  # prepare_rows' split
    again = loss_recovered(interp.sae.load(tmp_path / "l", model=model), model, images[torch.from_numpy(held)])
    assert measured["n_images"] == 2 and measured["distance"] == "mse_pooled"  # a random head
    assert measured["loss_recovered"] == pytest.approx(again["loss_recovered"], rel=1e-4, abs=1e-6)
    assert json.loads((tmp_path / "l" / "sae.json").read_text())["metrics"]["held_out"]["loss_recovered"] == measured
    cached_lr = cached["metrics"]["held_out"]["loss_recovered"]
    assert cached_lr["loss_recovered"] is None and "tensors" in cached_lr["note"]


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
            "--tokens-per-step", "256", "--expansion", "2", "--k", "2", "--lr", "3e-3", "--window-images", "16",
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


@pytest.mark.early(fresh_interpreter.NAME)
def test_overcomplete_is_loaded_without_patching_matplotlib():
    """overcomplete 0.3.0's package __init__ calls matplotlib.cm.get_cmap (gone in Matplotlib 3.9): interp loads
    overcomplete.sae without running it, leaves matplotlib as it was and no bare 'overcomplete' package behind
    (in a fresh interpreter that imported matplotlib.cm first: tests/fresh_interpreter.py)."""
    found = fresh_interpreter.checks()["overcomplete"]
    assert found == {"TopKSAE": True, "get_cmap_unchanged": True, "bare_package_loaded": False,
                     "sae_module_loaded": True}, found


def test_matryoshka_loss_is_the_mean_over_nested_prefixes(one_thread):
    torch.manual_seed(0)
    owner = sae_modules.architecture("matryoshka")(_settings(arch="matryoshka", k=4))
    module = owner.build(16, 32, 64, None)
    x = _batch(64)
    pre, codes, x_hat = module(x)
    dictionary = module.get_dictionary()
    total, parts = owner.loss(x, pre, codes, x_hat, module, dictionary, torch.zeros(32, dtype=torch.bool))
    assert sae_modules.matryoshka_prefixes(32) == [2, 4, 8, 16, 32]
    nested = [((x - codes[:, :m] @ dictionary[:m]) ** 2).sum(1).mean() for m in (2, 4, 8, 16, 32)]
    assert float(total.detach()) == pytest.approx(float(sum(nested).detach()) / 5, rel=1e-5)
    assert float(parts["matryoshka"].detach()) > 0  # a prefix reconstructs worse than the whole dictionary


@pytest.mark.parametrize("arch", ["relu", "jumprelu"])
def test_relu_and_jumprelu_train_with_the_default_objective(arch, tmp_path, one_thread):
    """With the default penalties and learning rate (small: expansion 2, 100 steps of 256 tokens), the held-out
    explained variance is high and the codes sparse (the summed L1 of before left it at -0.1 with every code 0)."""
    defaults = TrainSettings()
    result = train_planted(tmp_path / arch, arch=arch, steps=100, lr=defaults.lr, l1_penalty=defaults.l1_penalty,
                           l0_penalty=defaults.l0_penalty)
    held = result["metrics"]["held_out"]
    assert held["explained_variance"] > 0.9 and 1 <= held["l0"] < result["n_features"] / 2
    assert result["warnings"] == []


def test_quality_warnings():
    from interp.sae.train import quality_warnings

    low = quality_warnings({"explained_variance": 0.2}, 0.9, "held-out")
    assert len(low) == 2 and "explained variance 0.200" in low[0] and "90%" in low[1]
    assert quality_warnings({"explained_variance": 0.95}, 0.1, "held-out") == []
    assert "undefined" in quality_warnings({"explained_variance": None}, 0.0, "held-out")[0]
