"""The artifact-feature rule (interp.sae.artifact_rule, docs/methods.md section 8) on constructed firing: each
case of issue 33 item 5 (the old rule ``rate_high >= 0.5 and rate_normal <= 0.1 rate_high`` got them wrong).

The stand-in SAE reads its codes straight from the first channels (feature f = channel f, direction e_f), so
every firing pattern and every excess is set by hand."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.sae import artifact_rule as rule
from interp.sae.data import CLS, PATCH, REGISTER
from interp.sae.features import feature_report
from interp.sae.norm_cuts import fit_detection

N_FEATURES, N_IMAGES, N_PATCHES = 12, 50, 100
D = N_FEATURES + 1  # the last channel: a constant background


class ChannelSAE:
    """codes = relu(x[..., :n]); directions = the unit channels; trained on ``tokens``."""

    hook = "blocks.0.hook_resid_post"

    def __init__(self, tokens: str = "patches"):
        self.tokens, self.n_features, self.d = tokens, N_FEATURES, D
        self.mean = torch.zeros(D)
        self.directions = torch.eye(N_FEATURES, D)

    def check_hook(self, hook, d=None):
        assert d == D

    def encode(self, x):
        return torch.relu(x[..., :N_FEATURES])

    def decode(self, codes):
        return self.mean + codes @ self.directions


def _report(x: np.ndarray, kinds: np.ndarray, sae=None, targets=None):
    """feature_report over x [N, T, D] with the high-norm tokens those of patch norm > 5."""
    patches = kinds == PATCH
    detection = fit_detection(np.linalg.norm(x[:, patches], axis=-1), 5.0, len(x))
    return feature_report(sae or ChannelSAE(), [(0, x)], kinds, detection, targets=targets)


def _tokens(n_prefix_kinds=(CLS,)):
    kinds = np.array([*n_prefix_kinds] + [PATCH] * N_PATCHES, np.int8)
    x = np.zeros((N_IMAGES, len(kinds), D), np.float32)
    x[..., -1] = 1.0
    return x, kinds


def _fire(x, kinds, flat_tokens, feature, value=1.0):
    """Set ``feature``'s code on the patch tokens numbered ``flat_tokens`` (image-major over all patches)."""
    first = int(np.flatnonzero(kinds == PATCH)[0])
    for t in flat_tokens:
        x[t // N_PATCHES, first + t % N_PATCHES, feature] = value


def _high(x, kinds, flat_tokens, feature, value=10.0):
    _fire(x, kinds, flat_tokens, feature, value)  # a code of 10: norm above 5, the excess along the feature


def test_a_low_precision_feature_at_a_two_percent_artifact_share_is_not_flagged():
    """2 % of the patches are high-norm; feature 0 fires on all of them and on 406 normal patches (precision
    0.197: the old rule flagged it). Feature 1 carries the excess and fires only there: the one artifact feature."""
    x, kinds = _tokens()
    high = np.arange(0, 5000, 50)  # 100 of 5000
    _high(x, kinds, high, 1)
    _fire(x, kinds, high, 0, 0.5)
    normal = np.setdiff1d(np.arange(5000), high)[:406]
    _fire(x, kinds, normal, 0, 0.5)
    r = _report(x, kinds)
    assert r["n_tokens"]["high_norm"] == 100
    assert [f["feature"] for f in r["artifact_features"]] == [1]
    assert r["artifact_subspace"]["coverage"] > 0.95
    assert 0 not in [f["feature"] for f in r["enriched_features"]]  # precision 0.197 < 0.5: not even a candidate


def test_three_high_norm_tokens_are_too_few_to_flag_a_feature():
    """3 high-norm tokens; feature 0 fires on them and on 497 normal ones (precision 0.006: the old rule flagged
    it); feature 1 fires on the 3 only: still below the minimum count."""
    x, kinds = _tokens()
    high = np.array([7, 1500, 3300])
    _high(x, kinds, high, 1)
    _fire(x, kinds, high, 0, 0.5)
    _fire(x, kinds, np.setdiff1d(np.arange(5000), high)[:497], 0, 0.5)
    r = _report(x, kinds)
    assert r["n_tokens"]["high_norm"] == 3 and r["artifacts_found"]
    assert r["artifact_features"] == [] and r["enriched_features"] == []


def test_a_feature_split_in_three_is_flagged_as_one_subspace():
    """Three features of precision 1.0 each carry the artifact on a third of the high-norm tokens (the old rule
    flagged none: each fires on 33 %). Together they cover the excess."""
    x, kinds = _tokens()
    high = np.arange(0, 5000, 20)  # 250 tokens (5 %)
    for i, f in enumerate((2, 3, 4)):
        _high(x, kinds, high[i::3], f)
    r = _report(x, kinds, targets=[2, 3])
    assert sorted(f["feature"] for f in r["artifact_features"]) == [2, 3, 4]
    # the reconstruction's share: two of the three parts hold two thirds of what the SAE reconstructs
    whole = r["artifact_subspace"]["reconstruction_coverage"]
    assert whole > 0.95 and r["target_coverage"] == pytest.approx(2 / 3, abs=0.05)
    assert all(f["precision"] == 1.0 and 0.25 < f["coverage"] < 0.42 for f in r["artifact_features"])
    assert r["artifact_subspace"]["coverage"] > 0.95


def test_an_enriched_feature_that_carries_no_excess_stays_out_of_the_subspace():
    """Feature 5 fires only on the high-norm tokens but with a tiny code: enriched, not an artifact feature."""
    x, kinds = _tokens()
    high = np.arange(0, 5000, 25)
    _high(x, kinds, high, 6)
    _fire(x, kinds, high, 5, 0.01)
    r = _report(x, kinds)
    assert [f["feature"] for f in r["artifact_features"]] == [6]
    assert [f["feature"] for f in r["enriched_features"]] == [5]


def test_a_feature_on_every_register_is_a_register_feature():
    """A reg4 model, an SAE on all tokens: feature 7 fires on 100 % of the registers and nowhere else (the old
    rule: 'no artifact features' and nothing else); feature 8 on every CLS token."""
    x, kinds = _tokens((CLS, REGISTER, REGISTER, REGISTER, REGISTER))
    x[:, 1:5, 7] = 1.0
    x[:, 0, 8] = 1.0
    _fire(x, kinds, np.arange(0, 5000, 3), 9, 0.5)  # a common patch feature: neither
    r = _report(x, kinds, ChannelSAE("all"))
    kinds_found = {(p["feature"], p["kind"]) for p in r["prefix_features"]}
    assert kinds_found == {(7, "register"), (8, "cls")}
    assert "1 register and 1 CLS feature(s)" in r["message"]


def test_an_sae_on_the_cls_token_is_read_on_the_cls_token_only():
    x, kinds = _tokens()
    x[:, 0, 8] = 1.0
    _high(x, kinds, np.arange(0, 5000, 20), 1)
    r = _report(x, kinds, ChannelSAE("cls"))
    assert r["tokens"] == "cls" and r["analysed_kinds"] == ["cls"]
    assert r["features"][8]["rates"]["cls"] == 1.0 and r["features"][1]["rates"]["high_norm"] is None
    assert r["artifact_features"] == [] and "does not apply" in r["message"]
    assert not r["features"][1]["alive"]  # it fires only on patches, which this SAE never saw


def test_enrichment_against_the_base_rate():
    """Precision 0.9 on 100 firings at base rate 0.05: significant; the same precision on 4 firings: too few."""
    out = rule.enrichment(np.array([90, 4, 50]), np.array([100, 4, 1000]), 0.05, 10)
    assert out["enriched"].tolist() == [True, False, False]
    assert out["p_value"][0] < 1e-50 and out["precision"][2] == pytest.approx(0.05)


def test_span_cosine():
    d = torch.eye(4)[:2]
    assert rule.span_cosine(d, torch.tensor([1.0, 1.0, 0, 0])) == pytest.approx(1.0)
    assert rule.span_cosine(d, torch.tensor([1.0, 0, 1.0, 0])) == pytest.approx(2 ** -0.5)
    assert rule.span_cosine(torch.cat([d, d]), torch.tensor([0, 0, 1.0, 0])) == pytest.approx(0.0, abs=1e-9)


def _report_with(rates_high, rates_normal, enriched=(), subspace=()):
    n = len(rates_high)
    return {"n_alive": n, "n_tokens": {"normal_patch": 1000, "high_norm": 50, "cls": 0, "register": 0},
            "analysed_kinds": ["normal_patch", "high_norm"],
            "features": [{"feature": f, "alive": True, "rates": {"normal_patch": rates_normal[f],
                                                                 "high_norm": rates_high[f], "cls": None,
                                                                 "register": None}} for f in range(n)],
            "artifact_subspace": {"features": list(subspace)}, "enriched_features": [{"feature": f} for f in enriched]}


def test_controls_are_matched_on_firing_on_the_high_norm_tokens():
    """The target fires on every high-norm token: its controls fire on the high-norm tokens too (they can remove
    outliers; the old draw took only features that never fire there, which cannot fail in zero mode)."""
    from interp.sae.controls import control_features

    rates_high = [1.0, 0.9, 0.95, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.85, 0.8, 0.0]
    rates_normal = [0.0, 0.3, 0.2, 0.3, 0.2, 0.25, 0.3, 0.2, 0.3, 0.25, 0.3, 0.2]
    rates_high[11] = 0.9  # enriched but outside the subspace: a control that fires there without the excess
    report = _report_with(rates_high, rates_normal, enriched=[11], subspace=[0])
    controls = control_features(report, [0], 6, seed=0)
    assert all(len(c) == 1 and c[0] in {1, 2, 9, 10, 11} for c in controls)  # the high-norm firers, not 3..8
    assert len({c[0] for c in controls}) > 1
    from interp.sae.controls import matched_controls

    assert matched_controls(report, [0], 6, seed=0)[1] == [True] * 6
    lonely = _report_with([1.0, 0.0, 0.0], [0.0, 0.2, 0.2], subspace=[0])  # nothing else fires on high-norm tokens
    assert matched_controls(lonely, [0], 2, seed=0)[1] == [False, False]


def test_coinciding_control_sets_are_reported():
    """Two matched features for one target and four controls: some sets are the same features; said so."""
    from interp.sae.controls import coinciding_controls, control_features

    report = _report_with([1.0, 0.9, 0.9], [0.0, 0.2, 0.2], subspace=[0])
    controls = control_features(report, [0], 4, seed=0)
    pairs = coinciding_controls(controls)
    assert pairs and all(controls[i] == controls[j] for i, j in pairs)
    assert coinciding_controls([[1, 2], [1, 3]]) == []


def test_a_dense_feature_carrying_the_excess_is_an_artifact_feature():
    """Feature 2 fires on every patch, weakly (0.1) on the normal ones and strongly (10) on the 2 % high-norm ones:
    its count precision is the base rate (0.02), but 67 % of its code mass is on the high-norm tokens and it
    carries their whole excess (a Matryoshka SAE on the planted model puts the artifact in such a feature). It
    is magnitude-enriched and the one artifact feature; feature 0 (code 0.5 everywhere it fires) is neither."""
    x, kinds = _tokens()
    high = np.arange(0, 5000, 50)
    _fire(x, kinds, np.arange(5000), 2, 0.1)
    _high(x, kinds, high, 2)
    _fire(x, kinds, np.arange(0, 5000, 7), 0, 0.5)
    r = _report(x, kinds)
    assert [f["feature"] for f in r["artifact_features"]] == [2]
    (f,) = r["artifact_features"]
    assert f["precision"] == pytest.approx(0.02) and f["mass_precision"] == pytest.approx(1000 / 1490, rel=1e-4)
    assert r["artifact_subspace"]["coverage"] > 0.95
    assert r["features"][2]["cos_excess"] > 0.99 and abs(r["features"][0]["cos_excess"]) < 0.1
