"""Masking probe: k = 0 is the unmasked model, masks sit on the patch grid, and a constructed case is monotone."""
from __future__ import annotations

import pytest
import torch

from conftest import images, make_model
from interp.errors import InterpError
from interp.studies.aggregation.masking import (cells_to_mask, mask_images, masking_study, n_masked,
                                    target_classes)
from interp.runtime.open import open_source
from interp.studies.core.behaviour import imagenet_class_names
from interp.studies.core.pixels import gaussian_blur


@pytest.fixture(scope="module")
def vit():
    return make_model("vit", depth=1)


@pytest.mark.parametrize("patch, grid", [(16, (14, 14)), (14, (16, 16))])
def test_masked_pixels_are_the_fill_on_the_chosen_cells_only(patch, grid):
    x = images(2, size=patch * grid[0], seed=1)
    cells = torch.zeros(2, *grid, dtype=torch.bool)
    cells[0, 0, 0] = cells[0, 3, 5] = cells[1, grid[0] - 1, grid[1] - 1] = True
    fill = torch.tensor([0.25, -0.5, 2.0])
    out = mask_images(x, cells, fill, (patch, patch))
    expected = x.clone()
    for b, r, c in cells.nonzero().tolist():
        for ch in range(3):
            expected[b, ch, r * patch:(r + 1) * patch, c * patch:(c + 1) * patch] = fill[ch]
    assert torch.equal(out, expected)
    # Row 3 / col 5 of image 0 spans pixels [3p, 4p) x [5p, 6p): one pixel further is untouched.
    assert torch.equal(out[0, :, 3 * patch - 1, 5 * patch], x[0, :, 3 * patch - 1, 5 * patch])
    assert torch.equal(out[0, :, 3 * patch, 5 * patch], fill)
    # Image fill (blur): masked pixels come from the fill image.
    blurred = gaussian_blur(x, 4.0)
    out = mask_images(x, cells, blurred, (patch, patch))
    assert torch.equal(out[1, :, -patch:, -patch:], blurred[1, :, -patch:, -patch:])
    assert torch.equal(out[1, :, :-patch], x[1, :, :-patch])
    assert torch.equal(mask_images(x, torch.zeros_like(cells), fill, (patch, patch)), x)


def test_cells_to_mask_orders_and_sizes():
    scores = torch.arange(6.0).reshape(1, 2, 3)  # flat scores 0..5
    assert cells_to_mask(scores, 2, "top").flatten().tolist() == [False] * 4 + [True] * 2
    assert cells_to_mask(scores, 2, "bottom").flatten().tolist() == [True] * 2 + [False] * 4
    assert not cells_to_mask(scores, 0, "top").any()
    assert [n_masked(f, 196) for f in (0.0, 0.1, 0.5, 0.9)] == [0, 20, 98, 176]
    with pytest.raises(InterpError):
        n_masked(1.5, 196)


def test_blur_keeps_constants_and_means():
    x = torch.full((1, 3, 32, 32), 0.7)
    assert torch.allclose(gaussian_blur(x, 3.0), x, atol=1e-6)
    y = torch.zeros(1, 1, 64, 64)
    y[0, 0, 32, 32] = 1.0
    blurred = gaussian_blur(y, 2.0)
    assert abs(float(blurred.sum()) - 1.0) < 1e-5 and float(blurred.max()) < 0.05


def test_k0_reproduces_the_unmasked_model_one_forward_per_config(vit):
    x = images(3, seed=2)
    source = open_source(model=vit, images=x, batch_size=2)
    with torch.no_grad():
        reference = vit(x).argmax(-1)
    # The model's own top-1, computed here without the study, as the labels: accuracy at k = 0 must be 1. The
    # folders name the classes by their ImageNet synset ids (the 1000-class head's names), in sorted order.
    classes = sorted(set(reference.tolist()))
    source.labels = [classes.index(c) for c in reference.tolist()]
    source.class_names = [imagenet_class_names(1000)[c][0] for c in classes]
    calls = []
    with vit.hooks(fwd_hooks=[("hook_embed", lambda t, hook: calls.append(t.shape[0]))]):
        result = masking_study(source, fractions=[0.0, 0.5], fill="mean", orders=("top", "bottom"), progress=False)
    # 2 batches (2 + 1 images): one unmasked forward each, then one forward per (fraction, order).
    assert calls == [2, 1] + [2] * 4 + [1] * 4
    assert result.curves["top"]["agreement"][0] == 1.0 and result.curves["bottom"]["agreement"][0] == 1.0
    assert result.curves["top"]["outliers_per_image"][0] == result.unmasked["outliers_per_image"]
    assert result.n_masked == [0, 98]
    assert result.curves["top"]["accuracy"][0] == 1.0 and result.curves["bottom"]["accuracy"][0] == 1.0
    assert result.fill_value == pytest.approx(x.mean(dim=(0, 2, 3)).tolist(), abs=1e-5)
    # p98 of the unmasked patch norms: about 2 % of 196 patches are above it in the unmasked run.
    assert 2.0 <= result.unmasked["outliers_per_image"] <= 6.0


def test_monotone_on_a_constructed_case(vit):
    """Scores fall with the patch index; the readout predicts class 1 while enough 'object' patches (the
    low-score half, index >= 98) are unmasked, so masking the top-k costs nothing until k > 98."""
    n_prefix = vit.layout.n_prefix
    angles = torch.linspace(0.0, 3.0, 196)  # cos decreasing: patch 0 has the highest score
    need = torch.tensor([49, 30, 70])        # object patches image i needs to keep class 1
    pixels = {}

    def set_scores(tokens, hook):
        tokens = tokens.clone()
        tokens[:, 0] = 0.0
        tokens[:, 0, 0] = 1.0
        tokens[:, n_prefix:] = 0.0
        tokens[:, n_prefix:, 0] = torch.cos(angles)
        tokens[:, n_prefix:, 1] = torch.sin(angles)
        return tokens

    def readout(logits, hook):
        x = pixels["x"]  # [b, 3, 224, 224]
        cells = x.reshape(x.shape[0], 3, 14, 16, 14, 16)
        masked = (cells == 0).all(dim=(1, 3, 5)).flatten(1)  # [b, 196] zero-filled cells
        object_left = (~masked[:, 98:]).sum(1)
        out = torch.zeros_like(logits)
        out[torch.arange(len(x)), (object_left >= need).long()] = 1.0  # one batch holds the 3 images
        return out

    def capture(module, args):
        pixels["x"] = args[0]

    x = images(3, seed=4)
    source = open_source(model=vit, images=x, batch_size=3)
    handle = vit.timm_model.patch_embed.register_forward_pre_hook(capture)
    try:
        with vit.hooks(fwd_hooks=[("hook_norm_final", set_scores), ("hook_logits", readout)]):
            result = masking_study(source, fill="zero", progress=False)
    finally:
        handle.remove()
    # k = 0, 20, 39, 59, 78, 98, 118, 137, 157, 176. Object patches left: top order 98 until k > 98, then
    # 196 - k = 78, 59, 39, 20; bottom order 98 - k down to 0 at k = 98.
    # Kept class 1 iff left >= need (49, 30, 70): 98, 78 -> 3/3; 59 -> 2/3; 39 -> 1/3; 20, 0 -> 0.
    assert result.n_masked == [0, 20, 39, 59, 78, 98, 118, 137, 157, 176]
    assert result.curves["top"]["agreement"] == pytest.approx([1, 1, 1, 1, 1, 1, 1, 2 / 3, 1 / 3, 0])
    assert result.curves["bottom"]["agreement"] == pytest.approx([1, 1, 2 / 3, 1 / 3, 0, 0, 0, 0, 0, 0])
    for order in ("top", "bottom"):
        curve = result.curves[order]["agreement"]
        assert all(a >= b for a, b in zip(curve, curve[1:]))


def test_masking_needs_a_live_source_and_known_fill(vit):
    source = open_source(model=vit, images=images(1))
    with pytest.raises(InterpError, match="fill"):
        masking_study(source, fill="noise", progress=False)

    class Cached:
        model = None

    with pytest.raises(InterpError, match="live source"):
        masking_study(Cached(), progress=False)


def test_target_classes_from_folder_names():
    class Folder:
        labels = [0, 1, 1]
        class_names = ["207", "281"]

    imagenet = imagenet_class_names(1000)
    assert target_classes(Folder(), imagenet) is None  # a number is no class name (nor a sorted position)
    Folder.class_names = ["n02099601", "Egyptian_cat"]  # a synset id and a class name
    assert target_classes(Folder(), imagenet).tolist() == [207, 285, 285]
