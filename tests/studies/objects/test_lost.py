"""LOST object discovery: a hand-built case, the reference oracle on hooked models' keys, boxes and CorLoc."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import images, make_model

from interp.errors import InterpError
from interp.models.inputs.preprocessing import data_config
from interp.studies import open_source
from interp.formats.box_types import Box
from interp.models.inputs.geometry import input_geometry
from interp.models.inputs.preprocessing import timm_transform
from interp.studies.objects.lost import LostResult, corloc_hits, input_to_original, lost_one, lost_study, seed_component
from interp.studies.core.stats import box_iou
from reference.lost_object_discovery import keys_as_reference, lost as reference_lost

GRID = (5, 6)


def constructed_features():
    """Background cells share direction e0; object cells share e1 - 0.2 e0 (negative with the background).

    Object cells: a 2x2 blob at rows 1-2, cols 1-2 (first object cell in row-major order: 7), a 1x2 blob at
    row 4, cols 4-5 (not connected), and a lone cell at (3, 3), only diagonally next to the blob."""
    h, w = GRID
    obj = torch.zeros(h, w, dtype=torch.bool)
    obj[1:3, 1:3] = True
    obj[4, 4:6] = True
    obj[3, 3] = True
    g = torch.Generator().manual_seed(0)
    feats = torch.zeros(h * w, 8)
    feats[:, 0] = 1.0
    feats[obj.reshape(-1), 0] = -0.2
    feats[obj.reshape(-1), 1] = 1.0
    feats[:, 2:] = 0.01 * torch.randn(h * w, 6, generator=g)
    return feats, obj


def test_constructed_case_seed_mask_and_box_by_hand():
    feats, obj = constructed_features()
    out = lost_one(feats, GRID, k=100)
    assert out.seed == 7                      # lowest degree (6 others positive), lowest index among ties
    assert out.degrees[7] == 6 and out.degrees[0] == 30 - 7 - 1
    assert torch.equal(out.mask, obj)         # M > 0 exactly on the object cells
    assert out.box_cells == [1, 1, 3, 3]      # only the seed's 4-connected blob, not the diagonal cell
    assert not out.degenerate
    ref_box, ref_seed, _ = reference_lost(feats[None], GRID, k_patches=100)
    assert (ref_seed, ref_box) == (out.seed, out.box_cells)


def test_degenerate_when_all_degrees_are_equal():
    feats = torch.ones(30, 4) + 0.01 * torch.randn(30, 4, generator=torch.Generator().manual_seed(1))
    out = lost_one(feats, GRID, k=100)
    assert out.degenerate and out.seed == 0 and out.box_cells == [0, 0, 6, 5]


def test_seed_component_is_four_connected():
    mask = torch.tensor([[1, 1, 0], [0, 0, 1], [1, 0, 1]], dtype=torch.bool)
    assert seed_component(mask, (0, 0)).nonzero().tolist() == [[0, 0], [0, 1]]
    assert seed_component(mask, (2, 2)).nonzero().tolist() == [[1, 2], [2, 2]]
    assert not seed_component(mask, (1, 0)).any()


@pytest.mark.parametrize("family", ["vit", "dinov2_reg"])
@pytest.mark.parametrize("k", [100, 5])
def test_matches_reference_on_hooked_model_keys(family, k):
    model = make_model(family)
    x = images(3, seed=2)
    source = open_source(model=model, images=x)
    result = lost_study(source, k=k, progress=False)
    hook = f"blocks.{model.n_layers - 1}.attn.hook_k"
    _, cache = model.run_with_cache(x, names_filter=hook)
    feats = keys_as_reference(cache[hook], model.layout.n_prefix)
    for i in range(len(x)):
        box, seed, _ = reference_lost(feats[i:i + 1].double(), model.layout.grid, k_patches=k)
        assert (result.seeds[i], result.box_cells[i]) == (seed, box)
    assert result.hook == hook and result.boxes == [None] * 3       # tensor images: no original size
    assert result.boxes_input[0] == [c * 16.0 if family == "vit" else c * 14.0 for c in result.box_cells[0]]
    assert len(set(result.seeds)) > 1 or not all(result.degenerate)  # a real, not a constant, answer


def test_test_time_register_rows_are_excluded():
    from interp.interventions import TestTimeRegister

    model = make_model("vit")
    x = images(2, seed=3)
    plain = lost_study(open_source(model=model, images=x), progress=False)
    with model.intervene(TestTimeRegister({0: [1, 2]})):
        source = open_source(model=model, images=x)
        assert source.layout.n_extra == 1
        n_prefix = source.layout.n_prefix  # the layout while the edit is in force
        edited = lost_study(source, progress=False)
        hook = f"blocks.{model.n_layers - 1}.attn.hook_k"
        _, cache = model.run_with_cache(x, names_filter=hook)
    feats = keys_as_reference(cache[hook], n_prefix)   # prefix = CLS + the test-time register
    assert feats.shape[1] == 196
    box, seed, _ = reference_lost(feats[:1].double(), (14, 14))
    assert (edited.seeds[0], edited.box_cells[0]) == (seed, box)
    assert len(plain.seeds) == 2


def test_box_back_to_original_pixels_inverts_the_transform():
    model = make_model("vit")
    transform = timm_transform(data_config(model))
    geometry = input_geometry(transform, (640, 480))            # shorter side to 248, centre crop 224
    original = [300.0, 100.0, 420.0, 400.0]
    mapped = geometry.to_input(Box(*original)).as_list()
    assert input_to_original(mapped, geometry) == pytest.approx(original, abs=1e-6)
    whole = input_to_original([0.0, 0.0, 224.0, 224.0], geometry)  # the centre crop, not the whole image
    assert 0 < whole[0] < whole[2] < 640 and 0 < whole[1] < whole[3] < 480
    assert whole[0] == pytest.approx(640 - whole[2]) and whole[1] == pytest.approx(480 - whole[3])
    assert input_to_original([-200.0, -200.0, 500.0, 500.0], geometry) == [0.0, 0.0, 640.0, 480.0]  # clipped


def test_iou_and_corloc():
    assert box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert box_iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    hits = corloc_hits([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]],
                       [[[20, 20, 30, 30], [0, 0, 10, 8]], [[5, 0, 15, 10]], []])
    assert hits == [True, False, None]


def test_study_with_ground_truth_boxes_on_files(tmp_path):
    model = make_model("vit")
    from interp.models import sample_image_paths

    paths = sample_image_paths()[:3]
    source = open_source(model=model, images=[str(p) for p in paths])
    first = lost_study(source, progress=False)
    # Ground truth = the predicted boxes for the first two images (hits), a far-away box for the third.
    rows = ["image,x0,y0,x1,y1"] + [f"{p.name},{','.join(str(v) for v in b)}" for p, b in zip(paths[:2], first.boxes)]
    w = first.boxes[2]
    rows.append(f"{paths[2].name},{w[0]},{w[1]},{w[0] + 1},{w[1] + 1}")
    (tmp_path / "gt.csv").write_text("\n".join(rows) + "\n")
    result = lost_study(source, boxes=tmp_path / "gt.csv", progress=False)
    assert result.hits == [True, True, False] and result.corloc == pytest.approx(2 / 3)
    assert result.ci_low <= result.corloc <= result.ci_high and result.n_evaluated == 3
    back = LostResult.from_dict(json.loads(result.to_json()))
    assert back.seeds == result.seeds and back.box_cells == result.box_cells
    with pytest.raises(InterpError, match="k must be"):
        lost_study(source, k=0)


def positive_keys_model():
    """A depth-2 random ViT whose last block's keys share one large direction (a big key bias): every key
    correlates positively with every other, LOST's degenerate case (as DINOv2-S/14's keys at 224 px)."""
    model = make_model("vit")
    qkv = model.timm_model.blocks[-1].attn.qkv
    dim = qkv.in_features
    with torch.no_grad():
        qkv.bias[dim:2 * dim] = 50.0
    return model


def test_every_image_tied_says_what_it_means_and_what_to_try():
    from interp.plots.objects import lost_boxes

    result = lost_study(open_source(model=positive_keys_model(), images=images(3, seed=2)), progress=False)
    assert result.all_degenerate and result.box_cells == [[0, 0, 14, 14]] * 3          # box = whole image
    note = result.note
    assert note.startswith("degenerate: on every image (3 of 3)") and "the box is the whole image" in note
    assert "--layer" in note and "DINO ViT-S/16" in note                                  # what to try
    assert note in result.summary() and LostResult.from_dict(json.loads(result.to_json())).note == note
    texts = " ".join(t.get_text() for ax in lost_boxes(result).axes for t in ax.texts)
    assert "degenerate" in texts                                                         # no boxes drawn
    # earlier block: keys without the shared bias, ordinary seeds and no note
    earlier = lost_study(open_source(model=positive_keys_model(), images=images(3, seed=2)), layer=0,
                         progress=False)
    assert not any(earlier.degenerate) and earlier.note is None
