"""The artifact rule whatever the objective (issue 47 item 4): on a planted ViT whose artifact is one dense,
non-axis-aligned direction, every SAE objective interp trains gives an artifact subspace spanning the direction
whose removal takes the high-norm tokens away beyond random matched features (at the hook and at the last block);
a direction split over a hundred features each covering 1 % is found whole; an artifact the flagged features do
not remove is reported as not isolated."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import interp
from interp.detection.thresholds import detect_norms
from interp.interventions import SAEFeatureAblation
from interp.sae import artifact_rule as rule
from interp.sae.features import sae_features
from interp.studies.artifacts.ablate import SPECIFIC_MARGIN
from interp.values import SAE_ARCHS
from sae_helpers import dense_planted_model, dense_saes, needs_overcomplete, planted_images
from test_sae_artifact_rule import ChannelSAE, _high, _report, _tokens

LAST = "blocks.3.hook_resid_post"


def _outliers(model, images, threshold, interventions=()):
    with torch.no_grad(), model.intervene(*interventions):
        _, cache = model.run_with_cache(images, names_filter=LAST)
    return int(threshold.mask(cache[LAST][:, model.layout.patch_slice].norm(dim=-1)).sum())


@needs_overcomplete
@pytest.mark.parametrize("arch", SAE_ARCHS)
def test_every_objective_isolates_a_dense_planted_direction(arch, one_thread):
    model, direction = dense_planted_model()
    folder = dense_saes()
    sae = interp.sae.load(folder / f"sae-{arch}", model=model)
    report = sae_features(sae, model, cache=folder / "dense.h5")
    sub = report["artifact_subspace"]
    assert report["artifacts_found"] and sub is not None, report["message"]
    span = torch.tensor([f["direction"] for f in report["artifact_features"]])
    assert rule.span_cosine(span, direction) >= 0.9, (arch, report["message"])
    assert sub["isolated"] is True and sub["removed"] >= 0.9 and max(sub["controls_removed"]) <= 0.1, sub
    assert not report["message"].startswith("artifact not isolated")
    assert sub["coverage"] >= rule.COVER_SHARE * sub["path_coverage"] - 1e-12
    # the same features ablated in the model: the outliers of the last block go, the controls' stay
    images = planted_images(4, seed=5)  # held out
    with torch.no_grad():
        _, cache = model.run_with_cache(images, names_filter=LAST)
    threshold = detect_norms(cache[LAST][:, model.layout.patch_slice].norm(dim=-1)).threshold
    base = _outliers(model, images, threshold)
    assert base >= 10
    removed = 1 - _outliers(model, images, threshold, [SAEFeatureAblation(sae, sub["features"])]) / base
    controls = [1 - _outliers(model, images, threshold, [SAEFeatureAblation(sae, c)]) / base
                for c in sub["control_features"]]
    assert removed >= 0.9 and removed - max(controls) >= SPECIFIC_MARGIN, (removed, controls)


class _SplitSAE(ChannelSAE):
    """100 features along near-parallel dense directions (a dense unit direction ``u`` of the first 12 channels,
    each turned by its own noise), each coding a hundredth of ``x . u``: the artifact spread as BatchTopK and
    JumpReLU spread it, every feature covering about 1 % of the excess."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.u = torch.zeros(self.d)
        self.u[:12] = torch.randn(12, generator=g)
        self.u /= self.u.norm()
        self.n_features = 100
        noise = torch.zeros(100, self.d)
        noise[:, :12] = 0.1 * torch.randn(100, 12, generator=g)
        self.directions = self.u + noise
        self.directions /= self.directions.norm(dim=1, keepdim=True)
        self.weights = 1.0 / (100 * (self.directions @ self.u))  # sum_f w_f (d_f . u) = 1

    def encode(self, x):
        return torch.relu(x @ self.u)[..., None] * self.weights


def test_a_direction_split_over_a_hundred_features_is_found_whole():
    """The excess (10 u on 100 high-norm tokens of norm-1 background) is spread over 100 features, each covering
    about 2 % or less of it alone and less as others join (the old rule's fixed minimum gain of 0.02 stopped
    at once); the subspace spans ``u``, covers COVER_SHARE of the excess and its removal takes every high-norm token
    under its cut, beyond random features."""
    x, kinds = _tokens()
    sae = _SplitSAE()
    for t in np.arange(0, 5000, 50):
        x[t // 100, 1 + t % 100, :] += 10.0 * sae.u.numpy()
    r = _report(x, kinds, sae)
    sub = r["artifact_subspace"]
    assert r["n_tokens"]["high_norm"] == 100 and sub["n_enriched"] == 100
    assert max(f["coverage"] for f in r["artifact_features"]) < 0.021  # none alone reaches the old minimum gain
    assert len(sub["features"]) >= 70
    assert rule.span_cosine(torch.tensor([f["direction"] for f in r["artifact_features"]]), sae.u) > 0.99
    assert sub["coverage"] >= 0.94 and sub["removed"] == 1.0
    assert sub["isolated"] is True and max(sub["controls_removed"]) == 0.0


class _PartialSAE(ChannelSAE):
    """Codes a third of each channel: feature f's contribution holds a third of the excess along it, the rest is
    the SAE's error (which an ablation keeps)."""

    def encode(self, x):
        return torch.relu(x[..., :self.n_features]) / 3


def test_an_artifact_the_features_do_not_remove_is_said_not_isolated():
    """The flagged feature covers the excess's direction but removes a third of it: every high-norm token stays
    above its cut, as with random features; the headline says the artifact was not isolated."""
    x, kinds = _tokens()
    _high(x, kinds, np.arange(0, 5000, 50), 1)
    _high(x, kinds, np.arange(7, 5000, 50), 2, 0.3)  # features that fire on normal tokens: the controls
    for f in range(2, 12):
        x[:, 1 + np.arange(f, 100, 10), f] = 0.3
    r = _report(x, kinds, _PartialSAE())
    sub = r["artifact_subspace"]
    assert [f["feature"] for f in r["artifact_features"]] == [1]
    assert sub["removed"] == 0.0 and sub["controls_removed"] and sub["isolated"] is False
    assert r["message"].startswith("artifact not isolated:"), r["message"]
    assert "artifact feature(s)" not in r["message"]


def test_the_isolation_margin_is_the_ablation_studys():
    assert rule.ISOLATION_MARGIN == SPECIFIC_MARGIN
