"""Original DINOv3 checkpoint files (facebookresearch/dinov3 key names: ``storage_tokens``, ``ls1.gamma``, a fused
``qkv.bias`` with its ``bias_mask``, ``mask_token``, ``rope_embed.periods``) load through ``--weights`` into timm's
DINOv3 architectures, converted by timm's own ``checkpoint_filter_fn`` as DINOv2's files are; tested on state dicts
built here in the original's key names from a random timm model."""
from __future__ import annotations

import pytest
import timm
import torch

import interp
from interp.errors import ModelLoadError

SMALL = dict(depth=2, img_size=64, num_classes=0)


def original_format(timm_model) -> dict:
    """``timm_model``'s weights under the original DINOv3 key names (the inverse of timm's conversion)."""
    sd = {}
    for key, value in timm_model.state_dict().items():
        key = key.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma").replace("reg_token", "storage_tokens")
        if key.endswith("attn.q_bias"):
            v_bias = timm_model.state_dict()[key.replace("q_bias", "v_bias")]
            sd[key.replace("q_bias", "qkv.bias")] = torch.cat([value, torch.zeros_like(value), v_bias])
            sd[key.replace("q_bias", "qkv.bias_mask")] = torch.cat([torch.ones_like(value), torch.zeros_like(value),
                                                                    torch.ones_like(value)])
            continue
        if key.endswith("attn.v_bias"):
            continue
        sd[key] = value.clone()
    if not any(k.endswith("qkv.bias") for k in sd):  # the distilled B/L/H files carry all-zero qkv biases
        for i, block in enumerate(timm_model.blocks):
            sd[f"blocks.{i}.attn.qkv.bias"] = torch.zeros(block.attn.qkv.out_features)
            sd[f"blocks.{i}.attn.qkv.bias_mask"] = torch.ones(block.attn.qkv.out_features)
    sd["mask_token"] = torch.zeros(1, timm_model.embed_dim)
    sd["rope_embed.periods"] = timm_model.rope.periods.to(torch.bfloat16)  # the original stores them in bfloat16
    return sd


@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3", "vit_small_patch16_dinov3_qkvb"])
def test_original_dinov3_file_loads_and_reproduces_the_model(tmp_path, name, capsys):
    torch.manual_seed(3)
    source = timm.create_model(name, pretrained=False, **SMALL).eval()
    with torch.no_grad():  # make LayerScale and the q/v biases matter
        for p in source.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    sd = original_format(source)
    assert "storage_tokens" in sd and "blocks.0.ls1.gamma" in sd and "reg_token" not in sd
    path = tmp_path / "dinov3_original.pth"
    torch.save({"teacher": sd}, path)
    model = interp.load(name, weights=str(path), **SMALL)
    assert capsys.readouterr().out == ""  # timm's per-block note on dropped zero biases stays off the terminal
    assert model.layout.n_registers == 4
    for key, value in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0, msg=key)
    # RoPE rotates with the file's (bfloat16-rounded) periods, as the original code does
    assert model.timm_model.interp_rope_periods == "file"
    torch.testing.assert_close(model.timm_model.rope.periods, sd["rope_embed.periods"].float(), rtol=0, atol=0)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # timm's float32 periods give another table (the difference is small in this tiny random model's output)
        assert (model.timm_model.rope.get_embed(shape=(4, 4)) - source.rope.get_embed(shape=(4, 4))).abs().max() > 1e-3
        source.rope.periods.copy_(sd["rope_embed.periods"].float())
        assert (model(x) - source(x)).abs().max() <= 1e-5


def test_a_dinov3_file_with_another_register_count_builds_with_it(tmp_path):
    """Two storage tokens where vit_small_patch16_dinov3 has 4: Eva is built with num_reg_tokens=2 (no position
    table: RoPE gives the patches theirs) and computes timm's own 2-register model."""
    import warnings

    torch.manual_seed(0)
    source = timm.create_model("vit_small_patch16_dinov3", pretrained=False, num_reg_tokens=2, **SMALL).eval()
    path = tmp_path / "two_storage_tokens.pth"
    torch.save(original_format(source), path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load("vit_small_patch16_dinov3", weights=str(path), **SMALL)
    assert "holds 2 register tokens: built vit_small_patch16_dinov3 with num_reg_tokens=2 (its own: 4)" in str(
        caught[0].message)
    assert model.layout.n_registers == 2
    source.rope.periods.copy_(model.timm_model.rope.periods)  # the file's bfloat16-rounded periods, as the original
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), atol=1e-5, rtol=1e-5)


def test_the_file_periods_survive_a_lower_dtype_and_a_fixed_size_cache(tmp_path):
    """timm recomputes float32 periods when a cast lowers them, and caches the table of a fixed-size model: the
    file's periods are applied after the cast and the cache follows them."""
    torch.manual_seed(0)
    sd = original_format(timm.create_model("vit_small_patch16_dinov3", pretrained=False, **SMALL))
    path = tmp_path / "dinov3_original.pth"
    torch.save(sd, path)
    bf16 = sd["rope_embed.periods"].float()
    model = interp.load("vit_small_patch16_dinov3", weights=str(path), dtype="bfloat16", **SMALL)
    assert model.timm_model.rope.periods.dtype == torch.float32
    torch.testing.assert_close(model.timm_model.rope.periods, bf16, rtol=0, atol=0)
    fixed = interp.load("vit_small_patch16_dinov3", weights=str(path), dynamic_img_size=False, **SMALL).timm_model
    assert fixed.rope.pos_embed_cached is not None
    torch.testing.assert_close(fixed.rope.get_embed(), fixed.rope.get_embed(shape=(4, 4)), rtol=0, atol=0)
    fresh = timm.create_model("vit_small_patch16_dinov3", pretrained=False, dynamic_img_size=False, **SMALL)
    assert (fixed.rope.get_embed() - fresh.rope.get_embed()).abs().max() > 1e-4  # the cache was rebuilt


def test_a_dinov3_file_with_other_rope_periods_is_refused_clearly(tmp_path):
    torch.manual_seed(0)
    sd = original_format(timm.create_model("vit_small_patch16_dinov3", pretrained=False, **SMALL))
    sd["rope_embed.periods"] = sd["rope_embed.periods"][:8]
    path = tmp_path / "other_periods.pth"
    torch.save(sd, path)
    with pytest.raises(ModelLoadError, match="holds 8 RoPE periods"):
        interp.load("vit_small_patch16_dinov3", weights=str(path), **SMALL)


def test_timm_files_without_periods_keep_timms_float32_periods(tmp_path):
    torch.manual_seed(0)
    source = timm.create_model("vit_small_patch16_dinov3", pretrained=False, **SMALL)
    path = tmp_path / "timm_format.pth"
    torch.save(source.state_dict(), path)
    model = interp.load("vit_small_patch16_dinov3", weights=str(path), **SMALL)
    assert model.timm_model.interp_rope_periods is None
    torch.testing.assert_close(model.timm_model.rope.periods, source.rope.periods, rtol=0, atol=0)


def test_non_zero_qv_biases_without_a_place_in_the_architecture_are_refused(tmp_path):
    """Issue 53: an original file with non-zero q/v biases loaded into vit_small_patch16_dinov3 (no q/v biases)
    with the biases dropped (attn.hook_z off by up to 1.80 of 1.91); all-zero biases still load (the distilled
    files)."""
    torch.manual_seed(0)
    sd = original_format(timm.create_model("vit_small_patch16_dinov3_qkvb", pretrained=False, **SMALL))
    for i in range(SMALL["depth"]):  # a bias in q only in block 0, in v only in block 1 (k's third is masked)
        bias = sd[f"blocks.{i}.attn.qkv.bias"]
        third = bias.numel() // 3
        bias.zero_()
        bias[(0 if i == 0 else 2 * third) + 5] = 0.5
    torch.save(sd, tmp_path / "qv.pth")
    with pytest.raises(ModelLoadError, match=r"non-zero q/v biases \(blocks\.0\.attn\.qkv\.bias, blocks\.1\.attn\."
                                             r"qkv\.bias\).*_qkvb"):
        interp.load("vit_small_patch16_dinov3", weights=str(tmp_path / "qv.pth"), **SMALL)
    assert interp.load("vit_small_patch16_dinov3_qkvb", weights=str(tmp_path / "qv.pth"), **SMALL)
    for i in range(SMALL["depth"]):
        sd[f"blocks.{i}.attn.qkv.bias"][third:2 * third] = 1.0  # k's third: the original's mask zeroes it
        sd[f"blocks.{i}.attn.qkv.bias"][:third] = 0
        sd[f"blocks.{i}.attn.qkv.bias"][2 * third:] = 0
    torch.save(sd, tmp_path / "k_only.pth")
    assert interp.load("vit_small_patch16_dinov3", weights=str(tmp_path / "k_only.pth"), **SMALL)
