"""On the planted ViT: an SAE trained after the planted layer has an artifact feature along the register neurons'
write direction; removing it removes the high-norm tokens while random live features do not; a random-weight ViT
has no artifact features."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import interp
from conftest import make_model
from interp.interventions import SAEFeatureAblation
from interp.models import planted_truth
from interp.sae import artifact_rule as rule
from interp.sae.features import sae_features
from interp.detection.spec import DetectionSpec
from interp.detection.thresholds import detect_norms
from interp.errors import UsageError
from sae_helpers import HOOK, needs_overcomplete, planted_cache, planted_images, planted_model, planted_sae

pytestmark = needs_overcomplete


@pytest.fixture(scope="module")
def planted():
    model = planted_model()
    sae = interp.sae.load(planted_sae(), model=model)
    truth = planted_truth(model)
    report = sae_features(sae, model, cache=planted_cache(), neurons={truth.layer: list(truth.neurons)})
    return model, sae, report


def test_the_artifact_subspace_is_the_planted_write_direction(planted):
    """The artifact features (one, or the planted direction split over a few: TopK spreads it) span the register
    neurons' write direction, cover most of the high-norm tokens' excess, and each fires mostly there."""
    model, sae, report = planted
    assert report["artifacts_found"] and report["artifact_features"], report["message"]
    subspace = report["artifact_subspace"]
    assert subspace["features"] == [f["feature"] for f in report["artifact_features"]]
    assert subspace["cos_register_neurons"]["max"] >= 0.9 and subspace["cos_mean_high_norm"] >= 0.9
    assert subspace["coverage"] >= 0.5
    truth = planted_truth(model)
    channel = torch.zeros(sae.d)
    channel[truth.artifact_dim] = 1.0
    span = torch.tensor([f["direction"] for f in report["artifact_features"]])
    assert rule.span_cosine(span, channel) >= 0.9  # the write direction is the artifact channel
    for f in report["artifact_features"]:
        assert torch.tensor(f["direction"]).norm().item() == pytest.approx(1.0, abs=1e-5)
        assert f["precision"] >= 0.5 and f["rates"]["normal_patch"] <= 0.05 and f["coverage_gain"] > 0
    assert subspace["isolated"] is not False and subspace["removed"] >= 0.9  # removed at the hook (controls: few)
    assert len(report["features"]) == sae.n_features
    assert report["tokens"] == "patches" and report["n_tokens"]["cls"] == 0  # read on the tokens it was trained on
    assert all(f["rates"]["cls"] is None for f in report["features"])
    x = torch.from_numpy(interp.cache.open(planted_cache())[HOOK][:4, model.layout.patch_slice])
    recon = sae.decode(sae.encode(x))  # in the hook's units: the normalisation is undone
    assert (x - recon).square().sum() < 0.25 * (x - x.mean((0, 1))).square().sum()  # held-out EV about 0.84


def test_the_detection_is_a_spec_decided_at_the_saes_hook(planted):
    """sae_features takes detection= (a DetectionSpec) like every engine; its threshold applies to the norms at
    the SAE's hook, and a block other than the SAE's is refused."""
    model, sae, _ = planted
    report = sae_features(sae, model, cache=planted_cache(), detection=DetectionSpec(threshold="p99"))
    assert report["detection"]["method"] == "percentile" and report["hook"] == HOOK
    with pytest.raises(UsageError, match="SAE's own hook"):
        sae_features(sae, model, cache=planted_cache(), detection=DetectionSpec(detect_layer=0))

def _outliers(model, images, threshold, interventions=()):
    last = "blocks.5.hook_resid_post"
    with torch.no_grad(), model.intervene(*interventions):
        _, cache = model.run_with_cache(images, names_filter=last)
    norms = cache[last][:, model.layout.patch_slice].norm(dim=-1)
    return int(threshold.mask(norms).sum())  # each image above its own cut, as the detection counts them


def test_ablating_the_artifact_feature_removes_the_outliers_random_features_do_not(planted):
    model, sae, report = planted
    images = planted_images(6, seed=5)  # held-out images
    with torch.no_grad():
        _, cache = model.run_with_cache(images, names_filter="blocks.5.hook_resid_post")
    found = detect_norms(cache["blocks.5.hook_resid_post"][:, model.layout.patch_slice].norm(dim=-1))
    assert found.artifacts_found
    threshold = found.threshold
    base = _outliers(model, images, threshold)
    assert base > 20
    targets = [f["feature"] for f in report["artifact_features"]]
    removed = 1 - _outliers(model, images, threshold, [SAEFeatureAblation(sae, targets)]) / base
    assert removed >= 0.9
    mean_removed = 1 - _outliers(model, images, threshold, [SAEFeatureAblation(sae, targets, mode="mean")]) / base
    assert mean_removed >= 0.9
    # controls: live features that are not on the high-norm tokens (this small SAE has a handful of live features,
    # some of them along the artifact direction too without passing the rule: they would not be controls)
    live = [f["feature"] for f in report["features"]
            if f["alive"] and f["feature"] not in targets and f["rates"]["high_norm"] < 0.5]
    assert live
    rng = np.random.default_rng(0)
    for _ in range(3):
        control = [int(f) for f in rng.choice(live, size=min(len(targets), len(live)), replace=False)]
        assert 1 - _outliers(model, images, threshold, [SAEFeatureAblation(sae, control)]) / base <= 0.1


def test_a_random_weight_vit_has_no_artifact_features(tmp_path, one_thread):
    model = make_model("vit")
    hook = "blocks.1.hook_resid_post"
    path = tmp_path / "random.h5"
    interp.cache.write(model, torch.randn(6, 3, 224, 224, generator=torch.Generator().manual_seed(3)), hooks=hook,
                       path=path, progress=False, dtype="float32")
    interp.sae.train(model, hook, tmp_path / "sae", cache=path, progress=False, arch="topk", expansion=1, k=8,
                     steps=15, tokens_per_step=128, lr=3e-3, data_shards=2, window_images=4, holdout=0.2)
    report = sae_features(interp.sae.load(tmp_path / "sae", model=model), model, cache=path)
    assert report["artifacts_found"] is False and report["artifact_features"] == []
    assert report["message"].startswith("no artifacts") and report["message"].count("\n") == 0
    assert report["n_tokens"]["high_norm"] == 0
