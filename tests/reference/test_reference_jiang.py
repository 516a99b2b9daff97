"""Register-neuron scores, presets and emergence against the Jiang et al. reference (tests/reference/)."""
from __future__ import annotations

import pytest
import torch

import interp
from interp.errors import InterpError
from interp.studies.artifacts.emergence import EmergenceAccumulator, EmergenceCurves, find_emergence
from interp.detection.presets import PRESETS, resolve_preset
from interp.studies.artifacts.register_scores import RegisterScoreAccumulator, rank_neurons
from reference import jiang_register_neurons as ref
from interp.detection.spec import DetectionSpec


def random_images(n_images=9, n_layers=3, t=11, m=40, d=8, seed=0, dtype=torch.float32):
    """Per image: MLP acts [L, t, m] (mixed sparse/dense neurons, negative values like GELU) and block
    outputs [L, t, d] whose norms sit around 10, with a few tokens (CLS sometimes) near 40-60."""
    g = torch.Generator().manual_seed(seed)
    acts, outputs = [], []
    dense = torch.rand(n_layers, 1, m, generator=g) < 0.3  # neurons active on most tokens
    for i in range(n_images):
        a = torch.randn(n_layers, t, m, generator=g, dtype=torch.float64) * 0.4 - 0.1
        a = a + dense * (torch.rand(n_layers, t, m, generator=g, dtype=torch.float64) * 2)
        a = a + (torch.rand(n_layers, t, m, generator=g, dtype=torch.float64) < 0.05) * 3.0  # sparse spikes
        out = torch.randn(n_layers, t, d, generator=g, dtype=torch.float64)
        out = out / out.norm(dim=-1, keepdim=True) * 10
        if i % 4 != 3:  # every 4th image has no outlier
            hot = torch.randperm(t, generator=g)[:1 + i % 3]
            if i % 2 == 0:
                hot = torch.cat([hot, torch.tensor([0])])  # CLS is an outlier too
            out[:, hot] *= 4 + torch.rand(len(hot), 1, generator=g, dtype=torch.float64) * 2
        acts.append(a.to(dtype))
        outputs.append(out.to(dtype))
    return acts, outputs


def accumulate(acts, outputs, threshold, detect=-1, batch=4, **kw):
    """Stream the per-image lists through the accumulator in batches of ``batch`` images."""
    n_layers, _, m = acts[0].shape
    acc = RegisterScoreAccumulator(n_layers, m, **kw)
    for s in range(0, len(acts), batch):
        a = torch.stack(acts[s:s + batch])  # [b, L, t, m]
        norms = torch.stack(outputs[s:s + batch])[:, detect].norm(dim=-1)  # [b, t]
        acc.update({l: a[:, l] for l in range(n_layers)}, norms, threshold)
    return acc


@pytest.mark.parametrize("sparsity,ref_filter", [("per_image", True), (None, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_equal_reference_on_random_tensors(sparsity, ref_filter, dtype):
    acts, outputs = random_images(dtype=dtype)
    expected = ref.mean_neuron_scores(acts, outputs, register_norm_threshold=30, apply_sparsity_filter=ref_filter)
    for batch in (1, 4, 9):
        acc = accumulate(acts, outputs, 30.0, batch=batch, sparsity=sparsity)
        scores = acc.finalize()
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        assert (scores - expected).abs().max() <= tol * max(1.0, expected.abs().max())
        assert acc.n_images_used == sum(1 for i in range(9) if i % 4 != 3)
    if dtype == torch.float64:  # rankings: equal scores to 1e-12 -> identical order (ties by layer, neuron)
        ours = rank_neurons(scores, top_k=25, highest_layer=1)
        theirs = ref.top_register_neurons(ref.find_register_neurons(
            acts, outputs, register_norm_threshold=30, apply_sparsity_filter=ref_filter), highest_layer=1, top_k=25)
        assert [(e["layer"], e["neuron"]) for e in ours] == [(l, n) for l, n, _ in theirs]


def test_detection_layer_and_strict_threshold():
    acts, outputs = random_images(seed=3)
    # at block -2 of image 0 every token's norm is exactly the threshold: no outlier (norm > threshold)
    exact = outputs[0].clone()  # [L, t, d]
    exact[-2] = 0
    exact[-2, :, 0] = 25.0
    outputs = [exact] + outputs[1:]
    for detect in (-1, -2, 0):
        expected = ref.mean_neuron_scores(acts, outputs, register_norm_threshold=25, detect_outliers_layer=detect,
                                          apply_sparsity_filter=True)
        got = accumulate(acts, outputs, 25.0, detect=detect).finalize()
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_options_differ_from_reference_where_they_should():
    """positions="patches" drops an outlier CLS; the pooled filter decides over all images at once."""
    acts, outputs = random_images(seed=1)
    reference = accumulate(acts, outputs, 30.0).finalize()
    patches = accumulate(acts, outputs, 30.0, positions="patches", patch_slice=slice(1, None)).finalize()
    pooled = accumulate(acts, outputs, 30.0, sparsity="pooled").finalize()
    assert (patches - reference).abs().max() > 1e-3
    assert (pooled - reference).abs().max() > 1e-3
    # patch-only positions = the reference run on outputs whose CLS never crosses the threshold
    no_cls = [o.clone() for o in outputs]
    for o in no_cls:
        o[:, 0] = 0
    expected = ref.mean_neuron_scores(acts, no_cls, register_norm_threshold=30, apply_sparsity_filter=True)
    assert torch.allclose(patches, expected, atol=1e-5)


def test_pooled_filter_is_decided_over_all_tokens_of_used_images():
    # neuron 0 is below 0.5 on 60 % of tokens in image A, on 20 % in image B: per image keeps A only,
    # pooled (40 % of all tokens) drops it everywhere.
    t = 10
    a = torch.zeros(2, 1, t, 3)
    a[0, 0, 6:, 0] = 1.0
    a[1, 0, 2:, 0] = 1.0
    a[:, 0, :, 1] = -1.0
    a[:, 0, 5:, 2] = 2.0  # below 0.5 on exactly half the tokens: kept (">= half")
    outputs = torch.ones(2, 1, t, 1)
    outputs[:, 0, 9] = 100.0  # token 9 is the outlier in both images
    acts_list, out_list = list(a), list(outputs)
    per_image = accumulate(acts_list, out_list, 50.0).finalize()
    pooled = accumulate(acts_list, out_list, 50.0, sparsity="pooled").finalize()
    assert per_image[0].tolist() == [0.5, 1.0, 2.0]  # (1 + 0) / 2 images; neuron 1: |-1| everywhere
    assert pooled[0].tolist() == [0.0, 1.0, 2.0]
    assert torch.allclose(per_image, ref.mean_neuron_scores(acts_list, out_list, register_norm_threshold=50,
                                                            apply_sparsity_filter=True).double())


def test_no_outliers_is_a_clear_error():
    acts, outputs = random_images(n_images=3, seed=2)
    acc = accumulate(acts, outputs, 1e6)
    with pytest.raises(InterpError, match="lower the threshold"):
        acc.finalize()


def test_ranking_ties_break_by_layer_then_neuron():
    scores = torch.tensor([[1.0, 3.0, 3.0, 0.0], [3.0, 2.0, 0.0, 3.0], [9.0, 0.0, 0.0, 0.0]])
    ranked = rank_neurons(scores, top_k=6, highest_layer=1)
    assert [(e["layer"], e["neuron"]) for e in ranked] == [(0, 1), (0, 2), (1, 0), (1, 3), (1, 1), (0, 0)]
    assert rank_neurons(scores, top_k=1)[0] == {"layer": 2, "neuron": 0, "score": 9.0}
    # the reference's sort is unstable; our order is one of its valid orders: same scores, same sets per score
    theirs = ref.top_register_neurons(ref.sort_scores(scores), highest_layer=1, top_k=6)
    assert [s for _, _, s in theirs] == [e["score"] for e in ranked]
    assert {(l, n) for l, n, _ in theirs} == {(e["layer"], e["neuron"]) for e in ranked}
    with pytest.raises(InterpError, match="None for no limit"):
        rank_neurons(scores, highest_layer=-1)


@pytest.fixture(scope="module")
def planted_cache():
    model = interp.load("planted_vit")
    x = interp.load_images(interp.models.sample_image_paths(), model)
    _, cache = model.run_with_cache(x, names_filter=["blocks.*.hook_resid_post", "blocks.*.hook_resid_mid",
                                                     "blocks.*.mlp.hook_post", "blocks.*.attn.hook_pattern"])
    return model, {k: v.detach() for k, v in cache.items()}


def planted_truth(model):
    """The planted ground truth (layer, neurons) of a ``planted_vit`` model."""
    truth = interp.models.planted_truth(model)
    return truth.layer, tuple(truth.neurons)


def test_scores_equal_reference_on_hooked_model(planted_cache):
    model, cache = planted_cache
    n_layers = len(model.timm_model.blocks)
    acts = torch.stack([cache[f"blocks.{l}.mlp.hook_post"] for l in range(n_layers)], 1)  # [N, L, t, m]
    outs = torch.stack([cache[f"blocks.{l}.hook_resid_post"] for l in range(n_layers)], 1)  # [N, L, t, d]
    threshold = 300.0  # between the planted model's normal (< 160) and high-norm (~600) tokens
    expected = ref.find_register_neurons(list(acts), list(outs), register_norm_threshold=threshold,
                                         apply_sparsity_filter=True)
    acc = RegisterScoreAccumulator(n_layers, acts.shape[-1])
    for s in range(0, len(acts), 3):  # batches of 3 and 1
        acc.update({l: acts[s:s + 3, l] for l in range(n_layers)}, outs[s:s + 3, -1].norm(dim=-1), threshold)
    scores = acc.finalize()
    table = ref.mean_neuron_scores(list(acts), list(outs), register_norm_threshold=threshold,
                                   apply_sparsity_filter=True)
    assert (scores - table).abs().max() <= 1e-5 * table.abs().max()
    assert 0 < acc.n_images_used < len(acts)  # one sample photo has no high-norm token
    layer, neurons = planted_truth(model)
    # The planted neurons tie exactly (same weights); the reference's unstable sort orders ties at random,
    # so its list is compared after putting its ties in the documented order (lower layer, lower neuron).
    for highest, k in ((layer, 4), (layer, 30), (None, 30)):
        ours = rank_neurons(scores, top_k=k, highest_layer=highest)
        theirs = ref.top_register_neurons(expected, highest_layer=-1 if highest is None else highest, top_k=k)
        theirs = sorted(theirs, key=lambda e: (-e[2], e[0], e[1]))
        assert [(e["layer"], e["neuron"]) for e in ours] == [(l, n) for l, n, _ in theirs]
    top4 = rank_neurons(scores, top_k=4, highest_layer=layer)
    assert [(e["layer"], e["neuron"]) for e in top4] == [(layer, n) for n in sorted(neurons)]


def test_presets_hold_the_reference_config_numbers():
    # configs/openclip_base.yaml, openai_clip_base.yaml, dinov2_large.yaml, openclip_large.yaml
    jiang = {"jiang-openclip-b16": (-1, 30, 5, 10), "jiang-openai-clip-b16": (-1, 30, 5, 10),
             "jiang-dinov2-l14": (-2, 150, 17, 50), "jiang-openclip-l14": (-2, 150, 14, None)}
    for name, (detect, thr, highest, top_k) in jiang.items():
        p = PRESETS[name]
        assert (p["detect_layer"], p["threshold"], p["highest_layer"], p.get("top_k")) == (detect, thr, highest, top_k)
        assert p["sparsity"] == "per_image" and p["positions"] == "all"  # notebook: apply_sparsity_filter=True
    assert (PRESETS["darcet"]["threshold"], PRESETS["darcet"]["detect_layer"]) == (150.0, -1)
    assert PRESETS["reassessment"]["threshold"] == "p98"


def test_resolve_preset_explicit_wins_and_none_does_not():
    r = resolve_preset("JIANG_DINOV2_L14", top_k=20, threshold=None, seed=3)
    assert (r["top_k"], r["threshold"], r["highest_layer"], r["seed"], r["preset"]) == (20, 150.0, 17, 3,
                                                                                          "jiang-dinov2-l14")
    assert resolve_preset("openclip-b16")["preset"] == "jiang-openclip-b16"
    assert resolve_preset(None, top_k=None, threshold="auto") == {"threshold": "auto", "preset": None}
    with pytest.raises(InterpError, match="darcet"):
        resolve_preset("dinov2-g")


# ---------------------------------------------------------------------------------------------- emergence
def stream_curves(max_mid, max_post, med_mid, med_post):
    return EmergenceCurves({"resid_mid": max_mid, "resid_post": max_post},
                           {"resid_mid": med_mid, "resid_post": med_post}, None)


def test_emergence_uniform_growth_is_none_and_jump_is_found():
    L = 8
    grow = [2.0 ** i for i in range(2 * L)]  # max and median both double at every step
    mid, post = grow[0::2], grow[1::2]
    assert find_emergence(stream_curves(mid, post, [g / 3 for g in mid], [g / 3 for g in post])) is None
    for j in (0, 3, 6):
        post_j = [p * (20 if i >= j else 1) for i, p in enumerate(post)]  # max x20 after MLP of j
        mid_j = [m * (20 if i > j else 1) for i, m in enumerate(mid)]
        e = find_emergence(stream_curves(mid_j, post_j, [g / 3 for g in mid], [g / 3 for g in post]))
        assert (e["layer"], e["component"]) == (j, "mlp") and e["jump"] == pytest.approx(20)
        assert find_emergence(stream_curves(mid_j, post_j, [g / 3 for g in mid], [g / 3 for g in post]),
                              artifacts_found=False) is None
    mid_a = [m * (20 if i >= 4 else 1) for i, m in enumerate(mid)]  # jump in the attention step of 4
    post_a = [p * (20 if i >= 4 else 1) for i, p in enumerate(post)]
    e = find_emergence(stream_curves(mid_a, post_a, mid, post))
    assert (e["layer"], e["component"]) == (4, "attention")


def test_emergence_curves_equal_notebook_on_hooked_model(planted_cache):
    model, cache = planted_cache
    lay = model.layout
    n_layers = len(model.timm_model.blocks)
    acc = EmergenceAccumulator(n_layers)
    for s in range(0, 4, 3):  # two batches
        for l in range(n_layers):
            for stage in ("resid_mid", "resid_post"):
                acc.update(stage, l, cache[f"blocks.{l}.hook_{stage}"][s:s + 3, lay.patch_slice].norm(dim=-1))
            acc.update_attention(l, cache[f"blocks.{l}.attn.hook_pattern"][s:s + 3, :, lay.cls_index, lay.patch_slice])
    curves = acc.finalize()
    outs = torch.stack([cache[f"blocks.{l}.hook_resid_post"] for l in range(n_layers)], 1)
    pats = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"] for l in range(n_layers)], 1)
    max_norms, max_attn = ref.emergence_curves(list(outs), list(pats), lay.n_patches)
    assert curves.max_patch_norm["resid_post"] == pytest.approx(max_norms, rel=1e-6)
    assert curves.cls_attention_max == pytest.approx(max_attn, rel=1e-6)
    # One sample photo is mostly flat (its median patch is high-norm too), so the mean relative max only
    # doubles (x2.08); every other step stays within 1 %.
    e = find_emergence(curves, factor=1.5)
    assert (e["layer"], e["component"]) == (planted_truth(model)[0], "mlp")
    assert sorted(j for _, _, j in e["steps"])[-2] < 1.01


# ------------------------------------------------------------------------------ through the study entry point
def test_neurons_study_equals_reference_on_the_same_activations(planted_cache):
    """``neurons_study`` (defaults + the notebook's filter) ranks exactly as ``find_register_neurons`` run on
    the hooked model's own activations of the same images."""
    from interp.studies import open_source
    from interp.studies.artifacts.neurons import neurons_study

    model, cache = planted_cache
    n_layers = len(model.timm_model.blocks)
    acts = torch.stack([cache[f"blocks.{l}.mlp.hook_post"] for l in range(n_layers)], 1)  # [N, L, t, m]
    outs = torch.stack([cache[f"blocks.{l}.hook_resid_post"] for l in range(n_layers)], 1)  # [N, L, t, d]
    x = interp.load_images(interp.models.sample_image_paths(), model)
    source = open_source(model=model, images=x, batch_size=3)
    k = 30
    for filt in (True, False):
        result = neurons_study(source, detection=DetectionSpec(threshold=300.0), sparsity_filter=filt, top_k=k, progress=False)
        expected = ref.find_register_neurons(list(acts), list(outs), register_norm_threshold=300.0,
                                             apply_sparsity_filter=filt)
        theirs = sorted(ref.top_register_neurons(expected, highest_layer=n_layers - 1, top_k=k),
                        key=lambda e: (-e[2], e[0], e[1]))  # the reference's ties, in the documented order
        assert [(e["layer"], e["neuron"]) for e in result.neurons] == [(l, n) for l, n, _ in theirs]
        worst = max(abs(e["score"] - s) for e, (_, _, s) in zip(result.neurons, theirs))
        assert worst <= 1e-4 * max(s for _, _, s in theirs)
        assert result.positions == "all" and result.sparsity == ("per_image" if filt else None)
        assert 0 < result.n_images_with_outliers < len(x) and result.artifacts_found and result.warning is None


def test_neurons_study_preset_fills_defaults_and_explicit_flags_win(planted_cache):
    from interp.studies import open_source
    from interp.studies.artifacts.neurons import neurons_study

    model, _ = planted_cache
    source = open_source(model=model, images=interp.load_images(interp.models.sample_image_paths()[:2], model))
    # jiang-dinov2-l14: threshold 150, detect -2, highest 17 (beyond this model's blocks: given), top_k 50
    r = neurons_study(source, detection=DetectionSpec(preset="dinov2_l14"), top_k=7, highest_layer=3, progress=False)
    assert (r.preset, r.threshold, r.threshold_method, r.top_k, r.sparsity) == (
        "jiang-dinov2-l14", 150.0, "fixed", 7, "per_image")
    assert r.highest_layer == 3 and r.detect_layer == model.n_layers - 2
    assert r.params["preset"] == "jiang-dinov2-l14" and r.params["top_k"] == 7 and r.params["threshold"] == 150.0
    with pytest.raises(InterpError, match="planted_vit is not one"):  # CLIP presets need a QuickGELU CLIP
        neurons_study(source, detection=DetectionSpec(preset="openclip_b16"), progress=False)
    r = neurons_study(source, detection=DetectionSpec(preset="darcet", threshold=500.0), sparsity="pooled", positions="patches",
                      progress=False)
    assert (r.threshold, r.sparsity, r.positions, r.top_k) == (500.0, "pooled", "patches", 10)
    with pytest.raises(InterpError, match="unknown preset"):
        neurons_study(source, detection=DetectionSpec(preset="nope"), progress=False)
