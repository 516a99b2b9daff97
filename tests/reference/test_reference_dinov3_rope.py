"""timm's DINOv3 RoPE (``RotaryEmbeddingDinoV3`` in ``vit_small_patch16_dinov3``, as interp hooks it) against the
original DINOv3 code's arithmetic (tests/reference/dinov3_rope.py, facebookresearch/dinov3 at 6876159a): the
periods, the sin/cos tables and the rotated q/k of an attention layer at 224, 448 and 512 px and a non-square
input; and the one deviation, the original checkpoints' bfloat16 periods, which interp keeps when it loads an
original file."""
from __future__ import annotations

import pytest
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3

import interp
from reference import dinov3_rope as ref

HEAD_DIM = 64  # vit_small_patch16_dinov3: 384 / 6 heads
PATCH = 16
# (height, width) in pixels: the sizes docs/methods.md reports, and a non-square one
SIZES = [(224, 224), (448, 448), (512, 512), (224, 320)]
EXACT = 1e-6  # measured 0 at every size (same float32 ops); a margin for other builds of torch


@pytest.fixture(scope="module")
def dinov3():
    """A one-block random DINOv3-S (timm ``Eva``, ``dynamic_img_size=True``) in eval mode."""
    return interp.load("vit_small_patch16_dinov3", pretrained=False, seed=0, depth=1)


def max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def timm_sin_cos(rope, h: int, w: int):
    return rope.get_embed(shape=(h, w)).tensor_split(2, dim=-1)  # timm's [HW, 2 * dh] is [sin, cos]


def rotated_qk(model, x):
    """interp's q, k before and after RoPE in block 0, as [b, heads, t, dh] (the original's layout)."""
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.0.attn.hook_"))
    return [cache[f"blocks.0.attn.hook_{n}"].transpose(1, 2) for n in ("q", "k", "rot_q", "rot_k")]


def test_periods_equal_the_original(dinov3):
    rope = dinov3.timm_model.rope
    assert isinstance(rope, RotaryEmbeddingDinoV3) and rope.periods.dtype == torch.float32
    torch.testing.assert_close(rope.periods, ref.periods(HEAD_DIM, base=100.0), rtol=0, atol=0)
    # the min/max-period schedule (not used by the released ViTs) is written differently in timm: float error only
    other = RotaryEmbeddingDinoV3(HEAD_DIM, temperature=None, min_period=0.5, max_period=90.0)
    torch.testing.assert_close(other.periods, ref.periods(HEAD_DIM, None, 0.5, 90.0), rtol=1e-6, atol=0)


@pytest.mark.parametrize("height, width", SIZES)
def test_sin_cos_table_equals_the_original(dinov3, height, width):
    h, w = height // PATCH, width // PATCH
    rope = dinov3.timm_model.rope
    assert rope.normalize_coords == "separate"
    assert max_diff(timm_sin_cos(rope, h, w), ref.sin_cos(h, w, ref.periods(HEAD_DIM))) <= EXACT


@pytest.mark.parametrize("mode", ["min", "max", "separate"])
def test_coordinate_normalisations_equal_the_original_on_a_non_square_grid(mode):
    rope = RotaryEmbeddingDinoV3(HEAD_DIM, normalize_coords=mode).eval()
    table = ref.sin_cos(5, 9, ref.periods(HEAD_DIM), normalize_coords=mode)
    assert max_diff(timm_sin_cos(rope, 5, 9), table) <= EXACT
    if mode != "separate":  # the modes differ on a non-square grid, so the comparison can tell them apart
        assert max_diff(table, ref.sin_cos(5, 9, ref.periods(HEAD_DIM))) > 0.1


@pytest.mark.parametrize("height, width", SIZES)
def test_rotated_q_and_k_equal_the_original(dinov3, height, width):
    """interp's ``attn.hook_rot_q``/``hook_rot_k`` = the original's ``apply_rope`` on ``attn.hook_q``/``hook_k``:
    the CLS and 4 storage tokens kept, the patches rotated with the input grid's table."""
    x = torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(0))
    q, k, rot_q, rot_k = rotated_qk(dinov3, x)
    h, w = height // PATCH, width // PATCH
    assert q.shape[-2] == 1 + 4 + h * w
    oracle = ref.apply_rope(q, k, *ref.sin_cos(h, w, ref.periods(HEAD_DIM)))
    assert max_diff((rot_q, rot_k), oracle) <= EXACT
    assert max_diff((rot_q, rot_k), (q, k)) > 0.1  # the rotation is not the identity here


def test_no_coordinate_augmentation_in_eval_and_none_in_timm_training():
    """The original draws shift/jitter/rescale (the released ViTs: ``rescale_coords=2``) only in training; timm's
    DINOv3 models are built without them, so their table is the eval table in train mode too."""
    model = interp.load("vit_small_patch16_dinov3", pretrained=False, seed=0, depth=1).timm_model.train()
    table = ref.sin_cos(14, 14, ref.periods(HEAD_DIM))
    assert max_diff(timm_sin_cos(model.rope, 14, 14), table) <= EXACT


def test_bfloat16_periods_of_the_original_checkpoints_are_the_one_deviation(dinov3):
    """The original checkpoints carry ``rope_embed.periods`` rounded to bfloat16 (a persistent buffer; timm drops
    it and recomputes them in float32): the original code then rotates with those periods, and timm's rotation
    differs by up to ~0.008 in sin/cos and ~0.01 in q/k of unit scale (docs/methods.md gives the figures); interp
    keeps the file's periods (next test)."""
    bf16 = ref.periods(HEAD_DIM).to(torch.bfloat16)
    assert (bf16.float() != ref.periods(HEAD_DIM)).any()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    q, k, rot_q, rot_k = rotated_qk(dinov3, x)
    table = ref.sin_cos(14, 14, bf16)
    assert table[0].dtype == torch.float32  # fp32 arithmetic (released backbones), bf16-rounded periods
    table_diff = max_diff(timm_sin_cos(dinov3.timm_model.rope, 14, 14), table)
    qk_diff = max_diff((rot_q, rot_k), ref.apply_rope(q, k, *table))
    assert 1e-3 < table_diff < 0.02 and 1e-3 < qk_diff < 0.05


@pytest.mark.parametrize("height, width", [(224, 224), (512, 512), (224, 320)])
def test_with_an_original_files_periods_the_rotation_is_the_originals(height, width):
    """``interp.load(..., weights=<original DINOv3 file>)`` keeps the file's ``rope_embed.periods``
    (``keep_file_rope_periods``): q/k then rotate exactly as the original code rotates them with that file."""
    from interp.models.loading import keep_file_rope_periods

    model = interp.load("vit_small_patch16_dinov3", pretrained=False, seed=0, depth=1)
    bf16 = ref.periods(HEAD_DIM).to(torch.bfloat16)
    assert keep_file_rope_periods(model.timm_model, {"rope_embed.periods": bf16}, "file") == "file"
    x = torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(0))
    q, k, rot_q, rot_k = rotated_qk(model, x)
    assert max_diff((rot_q, rot_k), ref.apply_rope(q, k, *ref.sin_cos(height // PATCH, width // PATCH, bf16))) <= EXACT


def test_a_bfloat16_model_rotates_as_the_original_in_float32():
    """The released backbones compute the table in float32 (``pos_embed_rope_dtype="fp32"``) and rotate bfloat16
    q/k in float32, casting back; timm keeps its periods in float32 under a bfloat16 cast and does the same."""
    model = interp.load("vit_small_patch16_dinov3", pretrained=False, seed=0, depth=1, dtype="bfloat16")
    assert model.timm_model.rope.periods.dtype == torch.float32
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)).bfloat16()
    q, k, rot_q, rot_k = rotated_qk(model, x)
    assert q.dtype == rot_q.dtype == torch.bfloat16
    oracle = ref.apply_rope(q, k, *ref.sin_cos(14, 14, ref.periods(HEAD_DIM)))
    assert max_diff((rot_q.float(), rot_k.float()), (oracle[0].float(), oracle[1].float())) <= 1e-2  # measured 0
