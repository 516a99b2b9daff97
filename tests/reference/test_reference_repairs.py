"""The repairs study's published arithmetic against its oracles: SINDER's singular-defect directions
(``sinder_singular_defect.py``) and PH-Reg's test-time-augmentation views and recovery (``phreg_denoising.py``)."""
from __future__ import annotations

import timm
import torch
from timm.layers import SwiGLUPacked

from interp.hooks.hooked_vit import HookedViT
from interp.studies.repairs.sinder import singular_defect_directions
from interp.studies.repairs.tta import recover, tta_views, view_images

from . import phreg_denoising as phreg
from . import sinder_singular_defect as sinder


def test_sinder_directions_match_the_reference():
    """A DINOv2-style block (LayerScale, packed SwiGLU): the same random inputs give the same direction per block."""
    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, mlp_ratio=2.0, init_values=0.5,
        mlp_layer=SwiGLUPacked, act_layer=torch.nn.SiLU, num_classes=0).eval()
    for p in vit.parameters():  # LayerNorm and LayerScale away from their init, so every factor matters
        p.data.add_(0.1 * torch.randn_like(p))
    samples, seed = 3000, 7
    torch.manual_seed(seed)
    expected = sinder.singular_defect_directions(vit, samples)
    got = singular_defect_directions(HookedViT.from_timm(vit), samples, seed)
    for b, e in enumerate(expected):
        assert abs(float(torch.dot(got[b].double(), e.double()))) > 1 - 1e-5, b  # a direction: sign is arbitrary


def test_tta_views_and_recovery_match_the_reference():
    torch.manual_seed(1)
    patch, n, counts, frac, seed = 4, 7, 6, 0.3, 11
    img = torch.randn(3, n * patch, n * patch)
    ref_imgs, ref_idxs, ref_offsets, ref_flips = phreg.views(img, patch, counts, frac, (seed, seed + 1, seed + 2))
    views = tta_views((n, n), counts, frac, seed)
    assert views.offsets.tolist() == ref_offsets.tolist() and views.flips.tolist() == [bool(f) for f in ref_flips]
    for k in range(counts):
        got = view_images(img[None], views, k, (patch, patch), phreg.WHITE)[0]
        assert torch.equal(got, ref_imgs[k]), k
    feats = torch.randn(counts, n, n, 5)  # any per-view features
    expected = phreg.recover(feats, ref_idxs)
    got = recover([f.reshape(1, n * n, 5) for f in feats], views)[0].reshape(n, n, 5)
    assert torch.allclose(got, expected, atol=1e-6)
