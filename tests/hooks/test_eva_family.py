"""The Eva family (timm's ``Eva``: DINOv3, Perception Encoder, EVA02): hooked forward equal to timm's per block and
on the output (fused attention and with a pattern hook), RoPE hook points, the token layout read from the model,
LayerScale in the neurons' write directions, refused variants, and patch files on a plain timm ``Eva``."""
from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import timm
import torch
from timm.models.eva import Eva

import interp
from interp.errors import UnsupportedModelError
from interp.interventions import AttentionBias, NeuronAblation, SelectiveCLS, TestTimeRegister
from interp.interventions.export import apply_interventions
from interp.models.families import EvaFamily, family_of

TOL = 1e-5

# One small random-init model per family (few blocks, small images), each structurally faithful.
EVA_MODELS = {
    "dinov3": ("vit_small_patch16_dinov3", dict(depth=3, img_size=64)),    # RoPE (dinov3), 4 storage tokens, LayerScale
    "eva02": ("eva02_tiny_patch14_224", dict(depth=2, img_size=56)),      # RoPE (cat), abs pos, SwiGLU (GluMlp)
    "pe": ("vit_pe_core_small_patch16_384", dict(depth=2, img_size=64)),  # AttentionRope, norm_pre, attention pool
}


@lru_cache(maxsize=None)
def _built(kind: str) -> interp.HookedViT:
    name, kwargs = EVA_MODELS[kind]
    model = interp.load(name, pretrained=False, seed=0, **kwargs)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # LayerScale starts at 1e-5 and EVA's q/v biases at 0: make them matter
        for block in model.timm_model.blocks:
            for p in (block.gamma_1, block.gamma_2, getattr(block.attn, "q_bias", None),
                      getattr(block.attn, "v_bias", None)):
                if p is not None:
                    p.copy_(0.5 + 0.3 * torch.randn(p.shape, generator=g))
    return model


def eva_model(kind: str) -> interp.HookedViT:
    """A fresh copy of the small model of ``kind`` (built once per session)."""
    return copy.deepcopy(_built(kind))


def eva_images(model, n: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, *model.img_size, generator=torch.Generator().manual_seed(seed))


def timm_block_outputs(timm_model, x):
    """timm's own forward: (logits, {block: output [b, t, d]}) through forward hooks on its blocks."""
    outs = {}
    handles = [b.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o))
               for i, b in enumerate(timm_model.blocks)]
    try:
        with torch.no_grad():
            logits = timm_model(x)
    finally:
        for h in handles:
            h.remove()
    return logits, outs


def parity(model, x, pattern_hook: bool):
    """max |hooked - timm| over every block's residual stream and over the logits."""
    logits, ref = timm_block_outputs(model.timm_model, x)
    seen = []
    hooks = [(lambda n: n.endswith("attn.hook_pattern"), lambda t, hook: seen.append(hook.name))] if pattern_hook else []
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        out, cache = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_resid_post"))
    assert len(seen) == (model.n_layers if pattern_hook else 0)
    blocks = max((cache[f"blocks.{i}.hook_resid_post"] - ref[i]).abs().max().item() for i in ref)
    return blocks, (out - logits).abs().max().item()


@pytest.mark.parametrize("kind", list(EVA_MODELS))
@pytest.mark.parametrize("pattern_hook", [False, True])
def test_hooked_forward_equals_timm_per_block_and_output(kind, pattern_hook):
    model = eva_model(kind)
    assert isinstance(model.family, EvaFamily)
    blocks, out = parity(model, eva_images(model), pattern_hook)
    assert blocks <= TOL and out <= TOL, (kind, blocks, out)


def test_dinov3_at_another_input_size_equals_timm():
    model = eva_model("dinov3")  # dynamic_img_size=True: RoPE computed for the input's grid
    x = torch.randn(1, 3, 48, 80, generator=torch.Generator().manual_seed(2))
    blocks, out = parity(model, x, pattern_hook=True)
    assert blocks <= TOL and out <= TOL
    assert model.layout.grid == (3, 5)


def test_components_add_up_and_layerscale_is_inside_the_branch_outputs():
    model = eva_model("dinov3")
    _, cache = model.run_with_cache(eva_images(model, 1))
    blk = model.timm_model.blocks[1]
    for i in range(model.n_layers):
        c = lambda leaf: cache[f"blocks.{i}.{leaf}"]
        torch.testing.assert_close(c("hook_resid_pre") + c("hook_attn_out"), c("hook_resid_mid"))
        torch.testing.assert_close(c("hook_resid_mid") + c("hook_mlp_out"), c("hook_resid_post"))
    # hook_mlp_out = gamma_2 * fc2(hook_post); neuron_writes = gamma_2 * fc2 columns
    post = cache["blocks.1.mlp.hook_post"]
    torch.testing.assert_close(cache["blocks.1.hook_mlp_out"], blk.gamma_2 * blk.mlp.fc2(post))
    writes = model.neuron_writes(1)
    torch.testing.assert_close(writes, blk.mlp.fc2.weight * blk.gamma_2[:, None])
    torch.testing.assert_close(cache["blocks.1.hook_mlp_out"], post @ writes.T + blk.gamma_2 * blk.mlp.fc2.bias)


def test_rope_hooks_are_q_and_k_before_and_after_rope():
    model = eva_model("dinov3")
    x = eva_images(model, 1)
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.0.attn."))
    n_prefix = model.layout.n_prefix
    for q in ("q", "k"):
        pre, rot = cache[f"blocks.0.attn.hook_{q}"], cache[f"blocks.0.attn.hook_rot_{q}"]
        assert pre.shape == rot.shape == (1, model.layout.n_tokens, model.n_heads, 64)
        torch.testing.assert_close(pre[:, :n_prefix], rot[:, :n_prefix], rtol=0, atol=0)  # prefix: no RoPE
        assert (pre[:, n_prefix:] - rot[:, n_prefix:]).abs().max() > 1e-3  # patches rotated
        torch.testing.assert_close(pre.norm(dim=-1), rot.norm(dim=-1))  # a rotation keeps norms
    # scores are computed from the rotated q and k
    q, k = cache["blocks.0.attn.hook_rot_q"].transpose(1, 2), cache["blocks.0.attn.hook_rot_k"].transpose(1, 2)
    attn = model.timm_model.blocks[0].attn
    torch.testing.assert_close(cache["blocks.0.attn.hook_attn_scores"], (q * attn.scale) @ k.transpose(-2, -1))
    # an edit of the pre-RoPE query reaches the output
    base = model(x)
    edited = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_q", lambda t, hook: t * 0)])
    assert (edited - base).abs().max() > 1e-6


def test_hook_names_per_family():
    names = {kind: set(eva_model(kind).hook_dict) for kind in EVA_MODELS}
    for kind, hooks in names.items():
        assert {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k", "blocks.0.mlp.hook_post"} <= hooks, kind
    assert "blocks.0.mlp.hook_gate" in names["eva02"] and "blocks.0.mlp.hook_gate" not in names["dinov3"]
    no_rope = interp.HookedViT.from_timm(Eva(img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=2,
                                             num_classes=3).eval())
    assert not any("hook_rot" in n for n in no_rope.hook_dict)


def test_gated_mlp_neurons_are_the_product_fc2_reads():
    model = eva_model("eva02")
    _, cache = model.run_with_cache(eva_images(model, 1), names_filter=lambda n: n.startswith("blocks.0.mlp"))
    mlp = model.timm_model.blocks[0].mlp
    x1, x2 = cache["blocks.0.mlp.hook_pre"].chunk(2, dim=-1)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_gate"], mlp.act(x1))
    torch.testing.assert_close(cache["blocks.0.mlp.hook_post"], mlp.act(x1) * x2)
    assert model.d_mlp == mlp.fc2.in_features == cache["blocks.0.mlp.hook_post"].shape[-1]


def test_token_layout_is_read_from_the_model():
    dinov3, eva02, pe = (eva_model(k).layout for k in ("dinov3", "eva02", "pe"))
    assert (dinov3.n_prefix, dinov3.n_registers, dinov3.cls_index, dinov3.grid) == (5, 4, 0, (4, 4))
    assert dinov3.register_slice == slice(1, 5)
    assert (eva02.n_prefix, eva02.n_registers, eva02.cls_index, eva02.grid) == (1, 0, 0, (4, 4))
    assert (pe.n_prefix, pe.n_registers, pe.cls_index, pe.grid) == (1, 0, 0, (4, 4))
    no_cls = timm.create_model("vit_medium_patch16_rope_reg1_gap_256", pretrained=False, depth=1, img_size=64)
    lay = family_of(no_cls).layout()
    assert (lay.n_prefix, lay.n_registers, lay.cls_index) == (1, 1, None)


def test_unsupported_variants_are_refused_in_one_line():
    tiny = dict(img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    odd = Eva(**tiny)
    odd.blocks[0] = torch.nn.Identity()
    with pytest.raises(UnsupportedModelError, match="blocks.0 has an unsupported block type Identity") as e:
        interp.HookedViT.from_timm(odd)
    assert "\n" not in str(e.value)


def test_cli_name_check_accepts_eva_models():
    from interp._model_names import check_model_name_fast
    from interp.models.loading import check_model_name

    for name in ("vit_small_patch16_dinov3", "vit_pe_core_small_patch16_384", "eva02_tiny_patch14_224"):
        check_model_name(name)
        assert check_model_name_fast(name) in (True, False)  # False only when the shipped list is for another timm


# ---------------------------------------------------------------------------------------------- edits
def test_test_time_registers_skip_rope_and_pooling():
    model = eva_model("dinov3")
    x = eva_images(model)
    n_prefix = model.layout.n_prefix
    with model.intervene(TestTimeRegister({1: [3, 4]}, n_registers=2)), torch.no_grad():
        assert model.layout.n_prefix == n_prefix + 2
        _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.0.attn.hook_"))
    pre, rot = cache["blocks.0.attn.hook_k"], cache["blocks.0.attn.hook_rot_k"]
    torch.testing.assert_close(pre[:, :n_prefix + 2], rot[:, :n_prefix + 2], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["dinov3", "pe"])
def test_patch_file_edits_reproduce_on_a_plain_timm_eva(kind):
    model = eva_model(kind)
    x, calib = eva_images(model, 2), eva_images(model, 2, seed=5)
    cases = [
        [NeuronAblation({0: [1, 2]}, tokens="patches")],
        [TestTimeRegister({0: [7, 8], 1: [9]}, n_registers=2)],
        [AttentionBias.calibrate(model, calib, {0: [7, 8]})],
    ]
    if kind == "dinov3":
        cases.append([SelectiveCLS(k=2)])
    for interventions in cases:
        with torch.no_grad():
            hooked = model.run_with_interventions(x, interventions)
            plain = apply_interventions(copy.deepcopy(model.timm_model), interventions).eval()
            assert list(plain.state_dict()) == list(model.timm_model.state_dict())
            diff = (plain(x) - hooked).abs().max().item()
        assert diff <= TOL, (kind, interventions, diff)
        assert (hooked - model(x)).abs().max() > 1e-6, interventions  # the edit does something


def test_selective_cls_on_attention_pooling_is_refused_for_plain_models():
    model = eva_model("pe")
    from interp.interventions.export import PatchError

    with pytest.raises(PatchError, match="attention pooling"):
        apply_interventions(copy.deepcopy(model.timm_model), [SelectiveCLS(k=2)])


def test_dinov3_rope_table_is_the_closed_form_at_every_input_size():
    """What docs/methods.md states: timm's DINOv3 RoPE puts each patch centre at ((i + 0.5) / n) * 2 - 1 per axis
    (so every input size spans [-1, 1]), with periods 100 ** (2 j / (dh / 2)), j < dh / 4, angles 2 pi c / period,
    in the half-rotation layout: checked at 224, 448 and 512 px (14, 28, 32 patches per side) and a non-square grid."""
    import math

    rope = eva_model("dinov3").timm_model.rope
    dh = 64
    periods = 100.0 ** (2 * torch.arange(dh // 4, dtype=torch.float32) / (dh // 2))
    torch.testing.assert_close(rope.periods, periods)
    for h, w in ((14, 14), (28, 28), (32, 32), (3, 5)):
        sin, cos = rope.get_embed(shape=(h, w)).tensor_split(2, dim=-1)
        ys, xs = (((torch.arange(n) + 0.5) / n) * 2 - 1 for n in (h, w))
        coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1)  # [h*w, 2]
        angles = (2 * math.pi * coords[:, :, None] / periods).flatten(1).tile(2)  # [h*w, dh]
        torch.testing.assert_close(sin, angles.sin(), rtol=0, atol=1e-6)
        torch.testing.assert_close(cos, angles.cos(), rtol=0, atol=1e-6)


def test_input_grid_recomputes_a_cached_rope_table_and_restores_it():
    """LOST's full-image protocol runs a model at another grid (models.weights.pos_table.input_grid): EVA02's RoPE table
    is cached for the built grid and must follow, as timm's set_input_size does."""
    from interp.models.weights.pos_table import input_grid

    model = eva_model("eva02")
    x = eva_images(model, 1)
    base = model(x)
    fresh = timm.create_model("eva02_tiny_patch14_224", pretrained=False, depth=2, img_size=70)
    with input_grid(model, (5, 5)), torch.no_grad():
        torch.testing.assert_close(model.timm_model.rope.get_embed(), fresh.rope.get_embed())
        out = model(torch.randn(1, 3, 70, 70))
        assert out.shape == base.shape and model.layout.grid == (5, 5)
    torch.testing.assert_close(model(x), base, rtol=1e-6, atol=1e-6)


def test_nnsight_edit_of_a_rotated_query_equals_the_hook_edit():
    from nnsight import NNsight

    model = eva_model("dinov3")
    x = eva_images(model)

    def zero_head(t, hook):
        t = t.clone()
        t[:, :, 1] = 0
        return t

    expected = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_rot_q", zero_head)])
    nn_model = NNsight(model)
    with nn_model.trace(x):
        nn_model.blocks[1].attn.hook_rot_q.output[:, :, 1] = 0
        out = nn_model.output.save()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)  # the same arithmetic, either way
    assert (out - model(x)).abs().max().item() > 1e-6  # the edit did something


@pytest.mark.parametrize("variant", [
    dict(attn_type="rope", qkv_fused=False, scale_attn_inner=True, use_rot_pos_emb=True, init_values=0.5,
         attn_only_layer_scale=True, num_reg_tokens=2, gate=True),  # Sapiens2-like without GQA, gated attention
    dict(swiglu_mlp=True, scale_mlp=True, use_rot_pos_emb=True, rope_type="mixed",
         class_token=False, global_pool="avg"),                                       # SwiGLU with inner norm, mixed RoPE
    dict(qk_norm=True, use_rot_pos_emb=False, global_pool="token"),                   # EVA-style: no RoPE, qk norm
    dict(use_post_norm=True, use_rot_pos_emb=True, swiglu_mlp=True),                 # EVA02-E CLIP: post-norm blocks
    dict(attn_type="rope", qkv_fused=False, num_kv_heads=(4, 2), use_rot_pos_emb=True, num_reg_tokens=2,
         init_values=0.5, attn_only_layer_scale=True),                                # Sapiens2: grouped-query attention
])
def test_other_eva_variants_equal_timm(variant):
    torch.manual_seed(0)
    variant = dict(variant)
    gate = variant.pop("gate", False)
    timm_model = Eva(img_size=48, patch_size=16, embed_dim=64, depth=2, num_heads=4, num_classes=5, **variant).eval()
    if gate:  # timm's attention gate (EvaBlock(gated_attn=True); Eva's constructor does not expose it)
        for block in timm_model.blocks:
            block.attn.gate = torch.nn.Linear(64, 64)
    with torch.no_grad():
        for p in timm_model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    model = interp.HookedViT.from_timm(timm_model)
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    for pattern_hook in (False, True):
        blocks, out = parity(model, x, pattern_hook)
        assert blocks <= TOL and out <= TOL, (variant, pattern_hook, blocks, out)


def _gqa_model():
    torch.manual_seed(0)
    timm_model = Eva(img_size=48, patch_size=16, embed_dim=64, depth=2, num_heads=4, num_classes=5, attn_type="rope",
                     qkv_fused=False, num_kv_heads=(4, 2), use_rot_pos_emb=True, num_reg_tokens=2).eval()
    return interp.HookedViT.from_timm(timm_model)


def test_grouped_query_attention_hooks_have_the_key_value_heads():
    model = _gqa_model()
    x = torch.randn(1, 3, 48, 48)
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.1.attn."))
    t = model.layout.n_tokens
    assert cache["blocks.1.attn.hook_q"].shape == (1, t, 4, 16)
    assert cache["blocks.1.attn.hook_k"].shape == cache["blocks.1.attn.hook_rot_k"].shape == (1, t, 2, 16)
    assert cache["blocks.1.attn.hook_v"].shape == (1, t, 2, 16)
    assert cache["blocks.1.attn.hook_pattern"].shape == (1, 4, t, t)
    # query heads 0 and 1 read key/value head 0 (timm's repeat_interleave)
    q, k = cache["blocks.1.attn.hook_rot_q"], cache["blocks.1.attn.hook_rot_k"]
    attn = model.timm_model.blocks[1].attn
    scores = torch.einsum("bqhd,bkhd->bhqk", q * attn.scale, k.repeat_interleave(2, dim=2))
    torch.testing.assert_close(cache["blocks.1.attn.hook_attn_scores"], scores)


def test_attention_bias_and_registers_on_grouped_query_attention_match_the_plain_model():
    model = _gqa_model()
    x, calib = torch.randn(2, 3, 48, 48), torch.randn(2, 3, 48, 48)
    for interventions in ([AttentionBias.calibrate(model, calib, {1: [3, 4]})],
                          [TestTimeRegister({0: [3, 4]}, n_registers=2)]):
        with torch.no_grad():
            hooked = model.run_with_interventions(x, interventions)
            plain = apply_interventions(copy.deepcopy(model.timm_model), interventions).eval()
            assert (plain(x) - hooked).abs().max() <= TOL
            assert (hooked - model(x)).abs().max() > 1e-6
