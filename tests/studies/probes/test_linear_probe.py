"""interp.studies.probes.linear_probe: known answers (readable vs unreadable targets), grouped splits, determinism."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from interp.errors import InterpError
from interp.studies import ProbeFit, linear_probe
from interp.studies.probes.linear_probe import chance_score, fit_probe, r2_score, split_indices


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny probes run faster on one thread


def position_features(n_images=60, n_pos=16, d=32, readable=True, seed=0):
    """Tokens of n_images images with n_pos positions each: a random code per position + noise, or noise only."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randn(n_pos, d, generator=g)
    pos = torch.arange(n_pos).repeat(n_images)
    noise = torch.randn(n_images * n_pos, d, generator=g)
    x = codes[pos] + 0.3 * noise if readable else noise
    groups = torch.arange(n_images).repeat_interleave(n_pos)
    return x, pos, groups


def test_position_readable_vs_not():
    x, pos, groups = position_features(readable=True)
    good = linear_probe(x, pos, task="classify", groups=groups, seed=0)
    x_noise, _, _ = position_features(readable=False)
    bad = linear_probe(x_noise, pos, task="classify", groups=groups, seed=0)
    assert good.test_score > 0.97, good
    assert abs(good.chance - 1 / 16) < 0.03          # uniform positions: the majority guess is ~1/16
    assert bad.test_score < 0.15, bad               # unreadable: near chance on held-out images
    assert bad.train_score > bad.test_score          # (it can memorise noise on the training side)
    assert good.n_train + good.n_test == x.shape[0] and good.n_test == 15 * 16


def test_regression_linear_vs_noise():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3000, 20, generator=g)
    w = torch.randn(20, 12, generator=g)
    y = x @ w + 3.0
    linear = linear_probe(x, y, task="regress", seed=0)
    noise = linear_probe(x, torch.randn(3000, 12, generator=g), task="regress", seed=0)
    assert linear.test_score > 0.999 and linear.n_outputs == 12
    assert abs(noise.test_score) < 0.05 and abs(noise.chance) < 0.01
    assert linear.chance < 0.01


def test_groups_keep_each_group_on_one_side():
    groups = np.repeat(np.arange(10), 7)
    train, test = split_indices(70, test_fraction=0.3, seed=3, groups=groups)
    assert set(groups[train.numpy()]).isdisjoint(groups[test.numpy()])
    assert len(set(groups[test.numpy()])) == 3 and len(train) + len(test) == 70
    other_train, _ = split_indices(70, test_fraction=0.3, seed=4, groups=groups)
    assert not torch.equal(train, other_train)       # the seed matters
    with pytest.raises(InterpError, match="at least 2 groups"):
        split_indices(5, groups=[1] * 5)


def test_deterministic_for_a_seed_and_json():
    x, pos, groups = position_features(n_images=20, readable=True)
    a = linear_probe(x, pos, groups=groups, seed=5, epochs=2, min_steps=20)
    b = linear_probe(x, pos, groups=groups, seed=5, epochs=2, min_steps=20)
    assert a.to_dict() == b.to_dict()
    back = ProbeFit.from_dict(json.loads(a.to_json()))
    assert back == a


def test_auxiliary_regression_head_and_errors():
    x, pos, _ = position_features(n_images=30, readable=True)
    rowcol = torch.stack([pos // 4, pos % 4], 1).float() / 3
    probe = fit_probe(x, pos, "classify", n_classes=16, aux_targets=rowcol, seed=0)
    assert probe.weight.shape == (32, 18)
    assert r2_score(probe.outputs(x)[:, 16:], rowcol) > 0.9   # the auxiliary head learnt (row, col) too
    assert probe.score(x, pos) > 0.97
    with pytest.raises(InterpError, match="integer class ids"):
        fit_probe(x, torch.rand(x.shape[0]), "classify")
    with pytest.raises(InterpError, match="task="):
        linear_probe(x, pos, task="cluster")
    assert chance_score("classify", torch.tensor([1, 1, 2]), torch.tensor([1, 2, 2, 2])) == 0.25
