"""HookedViT's forward split as timm's (forward_features / forward_head), the edit state that ``intervene``
swaps in and out, and the dict ``run_with_cache`` returns."""
from __future__ import annotations

import pytest
import torch

import interp
from interp.errors import HookNameError

from conftest import images, make_model

TOL = 1e-5


# ---------------------------------------------------------------------------------------------- timm's forward split
def _pool_variants():
    """Small models covering timm's pooling kinds: CLS token, average (no CLS), MAP attention pooling."""
    torch.manual_seed(0)
    yield "token", make_model("dinov2_reg")
    yield "avg", interp.load("vit_small_patch16_224", pretrained=False, depth=2, class_token=False,
                             global_pool="avg", fc_norm=True)
    yield "map", interp.load("vit_small_patch16_224", pretrained=False, depth=2, global_pool="map")


def test_forward_features_and_head_match_timm_for_every_pooling():
    x = images(2)
    for kind, model in _pool_variants():
        tm = model.timm_model
        with torch.no_grad():
            feats = model.forward_features(x)
            ref_feats = tm.forward_features(x)
            assert (feats - ref_feats).abs().max().item() <= TOL, kind
            pooled = model.forward_head(feats, pre_logits=True)
            assert pooled.shape == (2, tm.num_features), kind
            assert (pooled - tm.forward_head(ref_feats, pre_logits=True)).abs().max().item() <= TOL, kind
            assert (model.forward_head(feats) - tm(x)).abs().max().item() <= TOL, kind
            torch.testing.assert_close(model(x), model.forward_head(model.forward_features(x)), rtol=1e-6, atol=1e-6)


def test_forward_head_delegates_to_timm_pool_only_without_edits(monkeypatch):
    model = make_model("vit")
    calls = []
    real_pool = model.timm_model.pool
    monkeypatch.setattr(model.timm_model, "pool", lambda t, *a, **k: calls.append(t.shape) or real_pool(t, *a, **k))
    model(images(1))
    assert calls == [(1, 197, model.d_model)]
    calls.clear()
    with model.intervene(ExtraTokens(1)):
        model(images(1))
    assert calls == []  # with a test-time register the prefix count differs from timm's


class ExtraTokens:
    """A minimal object following the intervention protocol: adds zero tokens (and optional extra k/v)."""

    stage = 0

    def __init__(self, n, kv=None):
        self.n, self.kv, self.seen = n, kv or {}, []

    def setup(self, model, state):
        self.seen.append(state)
        return state.add_tokens(self.n).add_kv(self.kv, torch.device("cpu"))

    def attach(self, model):
        return []


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_test_time_tokens_are_prefix_tokens_for_pooling(pool):
    torch.manual_seed(0)
    kwargs = dict(global_pool="avg", class_token=False, fc_norm=True) if pool == "avg" else {}
    model = interp.load("vit_small_patch16_224", pretrained=False, depth=2, **kwargs)
    n_prefix = model.layout.n_prefix
    with model.intervene(ExtraTokens(2)), torch.no_grad():
        assert model.layout.n_prefix == n_prefix + 2
        feats = model.forward_features(images(2))
        pooled = model.forward_head(feats, pre_logits=True)
    assert feats.shape[1] == model.layout.n_tokens + 2
    without_extra = torch.cat([feats[:, :n_prefix], feats[:, n_prefix + 2:]], dim=1)
    expected = model.timm_model.forward_head(without_extra, pre_logits=True)
    torch.testing.assert_close(pooled, expected, rtol=0, atol=1e-6)


def test_stop_at_layer_returns_the_residual_stream():
    model = make_model("vit")
    x = images(1)
    _, cache = model.run_with_cache(x, names_filter="blocks.0.hook_resid_post")
    torch.testing.assert_close(model(x, stop_at_layer=1), cache["blocks.0.hook_resid_post"], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------- edit state
def test_intervene_swaps_one_edit_state_object_in_and_out():
    from interp.hooks.edit_state import EditState

    model = make_model("vit")
    initial = model.edit_state
    assert initial == EditState() and not hasattr(model, "n_extra_tokens")
    first, second = ExtraTokens(1), ExtraTokens(2, kv={0: (torch.ones(6, 1, 64), torch.zeros(6, 1, 64))})
    with model.intervene(first, second):
        state = model.edit_state
        assert state is not initial and state.n_extra_tokens == 3 and sorted(state.extra_kv) == [0]
        assert first.seen == [initial] and second.seen[0].n_extra_tokens == 1  # each builds on the previous
        with model.intervene(ExtraTokens(1)):
            assert model.edit_state.n_extra_tokens == 4
        assert model.edit_state is state  # the nested context put its previous object back
    assert model.edit_state is initial
    with pytest.raises(RuntimeError, match="boom"):
        with model.intervene(ExtraTokens(1)):
            raise RuntimeError("boom")
    assert model.edit_state is initial


def test_setup_must_return_an_edit_state_and_nothing_leaks():
    model = make_model("vit", depth=1)

    class Broken(ExtraTokens):
        def setup(self, model, state):
            return None

    with pytest.raises(TypeError, match="must return the EditState"):
        with model.intervene(ExtraTokens(1), Broken(1)):
            pass
    assert model.edit_state.n_extra_tokens == 0 and model.layout.n_extra == 0


def test_device_and_dtype_moves_carry_the_extra_key_values():
    model = make_model("vit")
    kv = {1: (torch.randn(6, 2, 64), torch.randn(6, 2, 64))}
    x = images(1)
    with model.intervene(ExtraTokens(0, kv=kv)):
        reference = model(x)
        model.to(torch.float64)
        k, v = model.edit_state.extra_kv[1]
        assert k.dtype == v.dtype == torch.float64
        torch.testing.assert_close(model(x.double()).float(), reference, rtol=1e-4, atol=1e-5)
    assert model.edit_state.extra_kv == {}


# ---------------------------------------------------------------------------------------------- the cache dict
def test_run_with_cache_returns_a_dict_whose_misses_name_close_hooks():
    model = make_model("vit")
    _, cache = model.run_with_cache(images(1), names_filter="blocks.*.hook_resid_post")
    assert isinstance(cache, dict) and sorted(cache) == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert cache.get("blocks.0.hook_resid_mid") is None and "blocks.0.hook_resid_mid" not in cache
    with pytest.raises(KeyError, match="Close matches: blocks.1.hook_resid_post"):
        cache["blocks.1.hook_resid_pots"]
    with pytest.raises(HookNameError, match="'blocks.0.hook_resid_mid' was not cached.*names_filter"):
        cache["blocks.0.hook_resid_mid"]
    with pytest.raises(KeyError):
        cache[3]
    assert dict(cache) == cache and type(dict(cache)) is dict
