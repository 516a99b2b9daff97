"""Patch Score and PiB on constructed cases with known answers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import interp.cache
from conftest import images, make_model
from interp.errors import InterpError
from interp.interventions.selective_aggregation import selective_aggregate
from interp.interventions.selective_cls import SelectiveCLS
from interp.formats.box_files import read_boxes
from interp.studies.core.regions import regions_from_boxes
from interp.studies.aggregation.patch_score import PatchScoreResult, patch_score_study
from interp.studies.core.score_maps import compute_score_maps, score_maps_from_acts
from interp.studies.aggregation.pib import PiBResult, pib_study
from interp.studies.core.stats import bootstrap_ci
from interp.runtime.open import open_source


def write_images(folder, n, size=(224, 224), seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(folder / f"img{i}.png")
    return folder


def plant_cls_copy(model, chosen):
    """Hook on hook_norm_final: patch chosen[i] of image i becomes an exact copy of the CLS token (cos = 1).

    Only batches of exactly len(chosen) images are edited (all images in one batch; the cache writer's
    one-image shape probe is left alone)."""
    def hook(tokens, hook):
        if tokens.shape[0] != len(chosen):
            return tokens
        tokens = tokens.clone()
        n_prefix = model.layout.n_prefix
        for i, p in enumerate(chosen):
            tokens[i, n_prefix + p] = tokens[i, 0]
        return tokens
    return hook


@pytest.fixture(scope="module")
def dino():
    # crop_pct 1.0 at 224: a 224x224 image passes the preprocessing unchanged (boxes in input pixels).
    return make_model("dinov2", depth=1)


def test_pib_is_the_share_of_planted_patches_inside_the_box(dino, tmp_path):
    folder = write_images(tmp_path / "imgs", 7)
    # 14-px cells; box (56, 56, 112, 112) covers rows/cols 4..7 (112 is the border of cell 8, not inside).
    chosen = [5 * 16 + 5, 0, 7 * 16 + 7, 8 * 16 + 8, 5 * 16 + 5, 2 * 16 + 2, 5 * 16 + 5]
    (tmp_path / "boxes.csv").write_text(
        "image,x0,y0,x1,y1\n"
        "img0.png,56,56,112,112\n"      # (5, 5) inside -> hit
        "img1.png,56,56,112,112\n"      # (0, 0) outside
        "img2.png,56,56,112,112\n"      # (7, 7) inside -> hit
        "img3.png,56,56,112,112\n"      # (8, 8) just outside
        "img5.png,56,56,112,112\nimg5.png,20,20,50,50\n"   # two boxes; (2, 2) is in the second one
        "img6.png,0,0,224,200\n")       # 89 % of the image
    source = open_source(model=dino, images=str(folder), batch_size=16)
    with dino.hooks(fwd_hooks=[("hook_norm_final", plant_cls_copy(dino, chosen))]):
        result = pib_study(source, boxes=tmp_path / "boxes.csv", n_boot=500, seed=3, progress=False)
        loose = pib_study(source, boxes=tmp_path / "boxes.csv", single_object=False, max_box_fraction=None, n_boot=500,
                          progress=False)
    assert result.top_patch == chosen
    assert result.hits == [True, False, True, False, None, None, None]
    assert result.pib == 0.5 and result.n_used == 4 and result.n_images == 7
    assert result.excluded == {"no_box": 1, "several_boxes": 1, "too_large": 1, "cropped_away": 0}
    assert 0.0 <= result.ci_low <= 0.5 <= result.ci_high <= 1.0 and result.ci_low < result.ci_high
    # img5 counts with both boxes (hit in the second one), img6's big box is kept: (5, 5) is inside it.
    assert loose.hits == [True, False, True, False, None, True, True] and loose.pib == pytest.approx(4 / 6)
    # Round trip through JSON.
    result.to_json(tmp_path / "pib.json")
    back = PiBResult.from_json(tmp_path / "pib.json")
    assert back.pib == 0.5 and back.hits == result.hits and back.excluded == result.excluded


def test_bootstrap_is_seeded_and_sane():
    hits = np.array([1] * 70 + [0] * 30, dtype=float)
    assert bootstrap_ci(hits, 2000, 0.95, seed=1) == bootstrap_ci(hits, 2000, 0.95, seed=1)
    low, high = bootstrap_ci(hits, 2000, 0.95, seed=1)
    # Normal approximation of the interval: 0.7 +- 1.96 * sqrt(0.7 * 0.3 / 100) = [0.610, 0.790].
    assert abs(low - 0.610) < 0.02 and abs(high - 0.790) < 0.02
    assert bootstrap_ci(np.ones(5), 100, 0.9, seed=0) == (1.0, 1.0)


@pytest.mark.parametrize("family", ["vit", "dinov2_reg", "clip"])
def test_patch_score_matches_a_direct_computation(family):
    model = make_model(family)
    x = images(2)
    source = open_source(model=model, images=x)
    _, cache = model.run_with_cache(x, names_filter=["hook_norm_final", "hook_pooled"])
    tokens = cache["hook_norm_final"]
    lay = model.layout
    patches = tokens[:, lay.patch_slice]
    h, w = lay.grid
    expected = torch.nn.functional.cosine_similarity(patches, tokens[:, 0:1], dim=-1).reshape(2, h, w)
    maps = compute_score_maps(source, reference="cls", progress=False)
    assert maps.shape == (2, h, w)
    assert torch.allclose(maps, expected, atol=1e-5)
    # Selective with k = n_patches is average pooling: g = mean of the patch tokens.
    g = patches.mean(1, keepdim=True)
    expected = torch.nn.functional.cosine_similarity(patches, g, dim=-1).reshape(2, h, w)
    maps = compute_score_maps(source, reference="selective", selective=SelectiveCLS(k=lay.n_patches), progress=False)
    assert torch.allclose(maps, expected, atol=1e-4)


def test_pooled_reference_and_other_layers(dino):
    x = images(2)
    source = open_source(model=dino, images=x)
    # DINOv2 pools the CLS token and has no fc_norm: pooled == CLS output.
    assert torch.allclose(compute_score_maps(source, reference="pooled", progress=False),
                          compute_score_maps(source, reference="cls", progress=False), atol=1e-5)
    _, cache = dino.run_with_cache(x, names_filter=["blocks.0.hook_resid_post", "hook_norm_final"])
    lay = dino.layout
    mid = cache["blocks.0.hook_resid_post"][:, lay.patch_slice]
    expected = torch.nn.functional.cosine_similarity(mid, cache["hook_norm_final"][:, :1], dim=-1).reshape(2, 16, 16)
    maps = compute_score_maps(source, hook="blocks.0.hook_resid_post", reference="cls", progress=False)
    assert torch.allclose(maps, expected, atol=1e-5)


def test_pooled_of_another_width_is_refused():
    from interp.models.layout import TokenLayout

    lay = TokenLayout(n_prefix=1, n_registers=0, cls_index=0, grid=(2, 2))
    acts = {"hook_norm_final": torch.randn(1, 5, 8), "hook_pooled": torch.randn(1, 4)}
    with pytest.raises(InterpError, match="width 4 but the tokens have width 8"):
        score_maps_from_acts(acts, lay, reference="pooled")
    no_cls = TokenLayout(n_prefix=0, n_registers=0, cls_index=None, grid=(2, 2))
    with pytest.raises(InterpError, match="needs the CLS token"):
        score_maps_from_acts({"hook_norm_final": torch.randn(1, 4, 8)}, no_cls, reference="cls")


def test_selective_reference_is_what_the_head_sees_under_selective_cls():
    model = make_model("vit")
    x = images(2)
    spec = SelectiveCLS(k=7)
    with model.intervene(spec):
        _, cache = model.run_with_cache(x, names_filter=["hook_norm_final", "hook_pooled"])
    patches = cache["hook_norm_final"][:, model.layout.patch_slice]
    g, _ = selective_aggregate(patches, **spec.params())
    assert torch.allclose(cache["hook_pooled"], g, atol=1e-6)  # vit: fc_norm is Identity


def test_patch_score_study_fg_bg_and_cache_source(dino, tmp_path):
    folder = write_images(tmp_path / "imgs", 3)
    (tmp_path / "boxes.csv").write_text("image,x0,y0,x1,y1\nimg0.png,0,0,28,28\nimg1.png,56,56,112,112\n")
    chosen = [0, 5 * 16 + 5, 200]
    live = open_source(model=dino, images=str(folder))
    table = read_boxes(tmp_path / "boxes.csv")
    regions = regions_from_boxes(live.ids, table, live.data_config(), (16, 16))
    with dino.hooks(fwd_hooks=[("hook_norm_final", plant_cls_copy(dino, chosen))]):
        result = patch_score_study(live, regions=regions, progress=False)
        interp.cache.write(dino, str(folder), hooks=["hook_norm_final"], path=tmp_path / "acts.h5", dtype="float32",
                           progress=False)
    maps = result.maps_tensor()
    # fg = the 4 cells of img0 and the 16 cells of img1; img2 has no box.
    assert result.fg.n == 4 + 16 and result.bg.n == 2 * 256 - 20 and result.excluded["no_box"] == 1
    fg_values = torch.cat([maps[0, :2, :2].reshape(-1), maps[1, 4:8, 4:8].reshape(-1)])
    assert result.fg.mean == pytest.approx(float(fg_values.mean()), abs=1e-6)
    assert result.top_patch == chosen and maps.flatten(1).max(1).values.tolist() == pytest.approx([1.0] * 3, abs=1e-5)
    result.to_json(tmp_path / "ps.json")
    back = PatchScoreResult.from_json(tmp_path / "ps.json")
    assert back.fg.mean == result.fg.mean and torch.allclose(back.maps_tensor(), maps)
    # The same study from a cache of hook_norm_final (the planted copies are in the cache).
    cached = open_source(cache=tmp_path / "acts.h5", model=dino)
    from_cache = patch_score_study(cached, regions=regions, progress=False)
    assert torch.allclose(from_cache.maps_tensor(), maps, atol=1e-5)
    assert from_cache.patch_size == [14, 14]
    pib_cached = pib_study(cached, boxes=tmp_path / "boxes.csv", n_boot=100, progress=False)
    assert pib_cached.hits == [True, True, None] and pib_cached.pib == 1.0
    with pytest.raises(InterpError, match="needs hooks"):
        patch_score_study(cached, reference="pooled", progress=False)


def test_norms_only_cache_is_refused(dino, tmp_path):
    interp.cache.write(dino, images(2), hooks=["hook_norm_final"], path=tmp_path / "n.h5", norms_only=True,
                       progress=False)
    with pytest.raises(InterpError, match="norms only"):
        compute_score_maps(open_source(cache=tmp_path / "n.h5"), progress=False)
