"""Shared data of the SAE tests: a planted image set, its cache and one SAE trained on it (built once per run)."""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest
import torch

import interp
from built_once import built_once
from interp.models.planted import planted_vit
from interp.values import SAE_ARCHS

# overcomplete is the optional extra interp[sae] (in [test]); find_spec does not import it
needs_overcomplete = pytest.mark.skipif(importlib.util.find_spec("overcomplete") is None,
                                        reason="needs the optional extra interp[sae] (overcomplete)")

HOOK = "blocks.3.hook_resid_post"  # after the planted register neurons (block 2's MLP)
# Small and quick on 2 shared cores (one thread): k=2, since a TopK SAE spreads the one-dimensional artifact
# direction over its k active features (docs/sae.md); lr high enough to converge in 200 steps.
TRAIN = dict(arch="topk", expansion=2, k=2, steps=200, tokens_per_step=256, lr=3e-3, window_images=16, data_shards=2,
             holdout=0.125, dead_window=100)


def planted_images(n: int, seed: int, flat: float = 0.08) -> torch.Tensor:
    """Images of 7x7 blocks of 32 px: noise on a random colour, a share ``flat`` of blocks without noise (the planted
    model makes their patches high-norm tokens: about 7 % of the patches)."""
    g = torch.Generator().manual_seed(seed)
    colour = (torch.rand(n, 3, 7, 7, generator=g) * 2 - 1).repeat_interleave(32, 2).repeat_interleave(32, 3)
    noisy = (torch.rand(n, 1, 7, 7, generator=g) >= flat).float().repeat_interleave(32, 2).repeat_interleave(32, 3)
    return colour + noisy * 0.5 * torch.randn(n, 3, 224, 224, generator=g)


@functools.lru_cache(maxsize=None)
def planted_model():
    return interp.load("planted_vit")


@functools.lru_cache(maxsize=None)
def planted_cache(n: int = 48) -> Path:
    def build(folder: Path) -> None:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        with torch.no_grad():
            interp.cache.write(planted_model(), planted_images(n, seed=1), hooks=HOOK,
                               path=folder / "planted.h5", progress=False, dtype="float32", batch_size=16)
        torch.set_num_threads(before)

    return built_once(f"sae-cache-{n}", build) / "planted.h5"


def train_planted(out, **overrides):
    """Train the test SAE on the planted cache into ``out`` (one torch thread: faster on loaded shared cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return interp.sae.train(planted_model(), HOOK, out, cache=planted_cache(), progress=False,
                                **{**TRAIN, **overrides})
    finally:
        torch.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def planted_sae() -> Path:
    # 300 steps at lr 1e-3: the artifact subspace covers about 80 % of the high-norm tokens' excess (TRAIN's 200
    # steps at 3e-3 leave one feature covering 69 %, and the high-norm tokens of the last block at the edge of the
    # detection threshold once it is removed in mean mode)
    def build(folder: Path) -> None:
        train_planted(folder / "sae", checkpoint_every=1000, steps=300, lr=1e-3)

    return built_once("sae", build) / "sae"


@functools.lru_cache(maxsize=None)
def planted_sae_wide() -> Path:
    """A Matryoshka SAE (expansion 4, k 16) on the planted cache: besides the artifact's own features, several
    features fire on every high-norm token without writing along the artifact, so controls matched by firing
    exist (the test SAE above has none: 4 live features). About 40 s on one thread, built once per run."""
    def build(folder: Path) -> None:
        train_planted(folder / "sae", checkpoint_every=1000, arch="matryoshka", expansion=4, k=16, steps=300,
                      tokens_per_step=512, lr=1e-3)

    return built_once("sae-wide", build) / "sae"


# The dense bench (issue 47 item 4): a planted ViT whose register neurons write one dense random unit direction
# (every residual channel, no axis) instead of a reserved channel, the artifact tokens about 2.5x the bulk; one small
# SAE per objective interp trains, all on one cache (about 3 s each on one thread).
DENSE_HOOK = "blocks.2.hook_resid_post"  # after the register neurons of block 1, two blocks before the last
DENSE_TRAIN = dict(expansion=2, k=16, steps=60, tokens_per_step=128, lr=3e-3, window_images=16, data_shards=2,
                   holdout=0.125, dead_window=50, checkpoint_every=1000)


@functools.lru_cache(maxsize=None)
def dense_planted_model():
    """(the hooked model, the planted unit direction [96]): register neurons writing 14 times the direction."""
    model = interp.HookedViT.from_timm(planted_vit(layer=1, neurons=(17, 101, 202, 301), depth=4, embed_dim=96,
                                                   num_heads=2), name="planted_dense")
    direction = torch.randn(96, generator=torch.Generator().manual_seed(7))
    direction /= direction.norm()
    fc2 = model.timm_model.blocks[1].mlp.fc2
    with torch.no_grad():
        for n in (17, 101, 202, 301):
            fc2.weight[:, n] = 14.0 * direction
    return model, direction


@functools.lru_cache(maxsize=None)
def dense_saes() -> Path:
    """The dense bench's cache (``dense.h5``, 32 images) and one SAE per architecture (``sae-ARCH``)."""
    def build(folder: Path) -> None:
        model, _ = dense_planted_model()
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                interp.cache.write(model, planted_images(32, seed=1), hooks=DENSE_HOOK, path=folder / "dense.h5",
                                   progress=False, dtype="float32", batch_size=16)
            for arch in SAE_ARCHS:
                interp.sae.train(model, DENSE_HOOK, folder / f"sae-{arch}", cache=folder / "dense.h5",
                                 progress=False, arch=arch, **DENSE_TRAIN)
        finally:
            torch.set_num_threads(before)

    return built_once("sae-dense", build)
