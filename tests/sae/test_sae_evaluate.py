"""Loss recovered (interp.sae.evaluate) against its definition: a perfect reconstruction recovers 1, one that
outputs nothing 0 (zero ablation), the planted SAE most of the model's output."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import interp
from interp.sae.evaluate import loss_recovered
from sae_helpers import HOOK, needs_overcomplete, planted_images, planted_model, planted_sae


class Stand:
    """An SAE stand-in: encode is the identity, decode gives ``x * gain``."""

    hook, tokens = HOOK, "patches"

    def __init__(self, gain):
        self.gain = gain

    def check_model(self, model):
        pass

    def to(self, device):
        return self

    def encode(self, x):
        return x

    def decode(self, codes):
        return codes * self.gain


def test_perfect_and_empty_reconstructions(one_thread):
    model, images = planted_model(), planted_images(2, seed=3)
    perfect = loss_recovered(Stand(1.0), model, images)
    assert perfect["spliced"] == pytest.approx(0.0, abs=1e-9) and perfect["loss_recovered"] == pytest.approx(1.0)
    assert perfect["distance"] == "kl_logits" and perfect["zero_ablated"] > 0
    empty = loss_recovered(Stand(0.0), model, images)
    assert empty["loss_recovered"] == pytest.approx(0.0, abs=1e-9)


def test_rows_follow_the_token_kind():
    """One decision (TokenLayout.rows_of) for training, analysis, ablation and loss recovered."""
    from interp.models.layout import TokenLayout
    from interp.sae.data import token_kinds, token_mask

    layout = planted_model().layout
    t = torch.arange(layout.n_tokens)
    assert t[layout.rows_of("cls")].tolist() == [0] and t[layout.rows_of("patches")][0] == 1
    assert len(t[layout.rows_of("all")]) == layout.n_tokens
    with pytest.raises(interp.errors.InterpError, match="no register tokens"):
        layout.rows_of("registers")
    reg = TokenLayout(n_prefix=5, n_registers=4, cls_index=0, grid=(2, 2))
    kinds = token_kinds(reg, 0, reg.n_tokens)
    t = torch.arange(reg.n_tokens)
    for tokens in ("all", "patches", "cls", "registers"):  # the training tokens are the rows the SAE is read on
        assert t[reg.rows_of(tokens)].tolist() == np.flatnonzero(token_mask(kinds, tokens, "include", None, 1)[0]).tolist()


@needs_overcomplete
def test_the_planted_sae_recovers_most_of_the_output(one_thread):
    sae = interp.sae.load(planted_sae(), model=planted_model())
    out = loss_recovered(sae, planted_model(), planted_images(4, seed=5))
    assert 0.5 < out["loss_recovered"] <= 1.0 and out["tokens"] == "patches"


@needs_overcomplete
def test_sae_train_prints_the_loss_recovered(tmp_path, capsys, one_thread):
    """`interp sae train --images` reports the held-out loss recovered and which output it is measured on."""
    from interp.cli import main

    photos = str(interp.models.sample_image_paths()[0].parent)
    assert main(["sae", "train", "planted_vit", "--images", photos, "--hook", HOOK, "--out", str(tmp_path / "s"),
                 "--steps", "5", "--tokens-per-step", "64", "--expansion", "1", "--k", "4", "--data-shards", "1",
                 "--window-images", "3", "--holdout", "0.25", "--no-progress"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "loss recovered " in line and "(KL of the logits, 1 held-out images)" in line


@needs_overcomplete
def test_a_cache_of_image_files_gives_the_loss_recovered(tmp_path, one_thread):
    """Trained on a cache written from image files, the held-out images are read back from the cache's ids."""
    model = planted_model()
    photos = interp.models.sample_image_paths()
    path = tmp_path / "photos.h5"
    interp.cache.write(model, str(photos[0].parent), hooks=HOOK, path=path, progress=False, dtype="float32")
    out = interp.sae.train(model, HOOK, tmp_path / "s", cache=path, progress=False, arch="topk", expansion=1, k=4,
                           steps=5, batch_size=64, data_shards=1, window_images=3, holdout=0.25)
    measured = out["metrics"]["held_out"]["loss_recovered"]
    assert measured["n_images"] == 1 and measured["loss_recovered"] is not None
    assert measured["distance"] == "kl_logits" and measured["tokens"] == "patches"
