"""Formed inside, or carried from the input (interp.detection.formation): random-init models of every family over
grey images with a few saturated checkerboard cells. Their norms have a separated high-norm mode (the two-mode
split alone would call it artifacts), but the cells' tokens were already that high at the input of block 0 and no
block raised them: the detection says "no artifacts" and counts them as high-norm from the input."""
from __future__ import annotations

import pytest
import timm
import torch

import interp
from interp.detection.detection import detect, detection_header
from interp.hooks.hooked_vit import HookedViT
from interp.studies import open_source
from interp.studies.artifacts.neurons import neurons_study
from interp.detection.detection import RunOptions

CELL, SIZE = 32, 224  # a checkerboard cell covers 2 x 2 ViT patches, 8 x 8 cells of a pyramid's stage 0


def contrast_images(n: int = 4, k: int = 3, seed: int = 0):
    """(images [n, 3, 224, 224], cells Bool[n, 7, 7]): grey with a little noise, k saturated checkerboard cells."""
    g = torch.Generator().manual_seed(seed)
    x = 0.1 * torch.randn(n, 3, SIZE, SIZE, generator=g)
    yy, xx = torch.meshgrid(torch.arange(CELL), torch.arange(CELL), indexing="ij")
    board = ((yy // 2 + xx // 2) % 2).float() * 6 - 3
    cells = torch.zeros(n, SIZE // CELL, SIZE // CELL, dtype=torch.bool)
    for i in range(n):
        for c in torch.randperm(cells[0].numel(), generator=g)[:k].tolist():
            r, q = divmod(c, SIZE // CELL)
            x[i, :, r * CELL:(r + 1) * CELL, q * CELL:(q + 1) * CELL] = board
            cells[i, r, q] = True
    return x, cells


@pytest.fixture(scope="module")
def images():
    return contrast_images()


@pytest.mark.parametrize("name,kwargs", [
    ("vit_small_patch16_224", dict(depth=2)),
    ("vit_small_patch16_dinov3", dict(depth=2, embed_dim=192, num_heads=3, img_size=224, init_values=0.5))])
def test_a_plain_vits_high_norms_from_the_input_are_not_artifacts(images, name, kwargs):
    x, cells = images
    source = open_source(model=interp.load(name, pretrained=False, **kwargs), images=x, batch_size=4)
    det = detect(source, options=RunOptions(progress=False))
    assert det.threshold.artifacts_found  # the split alone: a separated high-norm mode
    assert not det.artifacts_found and not det.outliers.any()
    carried = cells.repeat_interleave(2, 1).repeat_interleave(2, 2).flatten(1)  # the cells' 2 x 2 patches
    assert torch.equal(det.from_input, carried)
    assert det.survey is not None and not any(v.found for v in det.survey.blocks)
    header = detection_header(det, "norms", warn=False)
    assert not header["artifacts_found"] and header["high_norm_from_input"] == int(carried.sum())
    assert "high-norm from the input (not formed by the blocks" in header["warning"]
    assert not neurons_study(source, detection=det, top_k=4, progress=False).neurons  # nothing ranked


@pytest.mark.parametrize("name,kwargs", [
    ("pvt_v2_b0", {}),
    ("swinv2_tiny_window8_256", dict(depths=(2, 2, 2, 2), embed_dim=32, num_heads=(1, 2, 4, 8), window_size=7,
                                     img_size=SIZE))])
def test_a_pyramids_high_norms_from_the_input_are_not_artifacts(images, name, kwargs):
    """A pyramid's patch embedding ends in a LayerNorm that gives every token the same norm: without it (taken
    out here) stage 0 carries the cells' norms, a separated mode at both its blocks, and no stage has artifacts."""
    x = images[0][:2]
    module = timm.create_model(name, pretrained=False, **kwargs).eval()
    module.patch_embed.norm = torch.nn.Identity()
    det = detect(open_source(model=HookedViT.from_timm(module, name=name), images=x, batch_size=4), options=RunOptions(progress=False))
    stage0 = [v for v in det.survey.blocks if v.stage == 0]
    assert len(stage0) == 2 and all(v.n_from_input > 0 and v.n_outliers == 0 and not v.found for v in stage0)
    assert not det.artifacts_found and det.layer == len(det.survey.blocks) - 1
    assert det.survey.describe() == "stage 0: none; stage 1: none; stage 2: none; stage 3: none"
