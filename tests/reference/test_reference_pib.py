"""PiB protocol "last" against the LaSt reference geometry and filters (tests/reference/last_patch_hit.py)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image

import interp
from interp.errors import InterpError
from interp.studies.aggregation.pib_protocol import last_box_cells, last_keep, last_regions
from reference import last_patch_hit as ref


def random_cases(n: int, seed: int = 0):
    """(box, (W, H), patch) triples: random sizes from tiny to large, boxes inside, across and outside the
    crop, and boxes whose mapped edges fall exactly on cell borders."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        kind = i % 4
        if kind == 0:  # any size, any box (possibly partly outside the image)
            w, h = rng.randint(8, 3000), rng.randint(8, 3000)
            xs = sorted(rng.uniform(-0.2, 1.2) * w for _ in range(2))
            ys = sorted(rng.uniform(-0.2, 1.2) * h for _ in range(2))
            box = (xs[0], ys[0], xs[1], ys[1])
        elif kind == 1:  # integer boxes on ImageNet-like sizes
            w, h = rng.choice([(500, 375), (375, 500), (500, 333), (640, 480), (333, 500), (1024, 683)])
            x0, y0 = rng.randint(0, w - 2), rng.randint(0, h - 2)
            box = (x0, y0, rng.randint(x0 + 1, w), rng.randint(y0 + 1, h))
        elif kind == 2:  # scale exactly 1 or 0.5 (short side 256 / 512): edges land on cell borders
            short = rng.choice([256, 512])
            long = short + 2 * rng.randint(0, 200)
            w, h = (short, long) if rng.random() < 0.5 else (long, short)
            s = 256 / short
            left, top = (int(w * s) - 224) // 2, (int(h * s) - 224) // 2
            cells = sorted(rng.sample(range(0, 15), 2)), sorted(rng.sample(range(0, 15), 2))
            box = tuple((v * 16 + off) / s for v, off in ((cells[0][0], left), (cells[1][0], top),
                                                            (cells[0][1], left), (cells[1][1], top)))
        else:  # boxes wholly outside the crop on one side, and tiny images
            w, h = rng.randint(2, 40), rng.randint(300, 900)
            if rng.random() < 0.5:
                w, h = h, w
            box = rng.choice([(0, 0, 1, 1), (w - 1, h - 1, w, h), (0, h - 2, w, h), (w - 2, 0, w, h)])
        cases.append((box, (w, h), rng.choice([16, 14, 8])))
    return cases


def test_cells_equal_reference_on_many_boxes():
    mismatches = 0
    empty = 0
    for box, (w, h), patch in random_cases(4000):
        got = last_box_cells(box, (w, h), patch_size=patch)
        expected = ref.bbox_to_patch_set(list(box), w, h, image_size=224, patch_size=patch)
        mismatches += got != expected
        empty += not got
    assert mismatches == 0
    assert empty > 0  # some boxes fall wholly right of / below the crop


def test_cells_hand_checked_edges():
    # W = H = 256: scale 1, crop offset 16. A box from x = 48 to 80 maps to 32..64 -> cells 2, 3 AND 4
    # (the right edge lies exactly on the border of cell 4, which the reference counts as touched).
    cells = last_box_cells((48, 48, 80, 80), (256, 256))
    assert cells == {r * 14 + c for r in (2, 3, 4) for c in (2, 3, 4)}
    # wholly left of the crop: clipped to x = 0 -> column 0 counts; wholly right: nothing.
    assert last_box_cells((0, 100, 10, 110), (256, 256)) == {5 * 14}  # rows 84..94 -> row 5, column 0
    assert last_box_cells((245, 100, 256, 110), (256, 256)) == set()
    # the 14-px patch grid of DINOv2-style models: 16 x 16 cells over the same crop
    assert last_box_cells((16, 16, 17, 17), (256, 256), patch_size=14) == {0}
    # int() truncation: 103 * (256 / 103) = 255.99999999999997 -> resized width 255 (torchvision: 256), so the
    # left crop offset is 15, not 16; x1 = 31.5 / scale maps to 16.5 -> columns 0 AND 1 (offset 16: column 0).
    assert last_box_cells((0, 0, 31.5 * 103 / 256, 1), (103, 200)) == {0, 1}
    with pytest.raises(InterpError, match="protocol='model'"):
        last_box_cells((0, 0, 1, 1), (256, 256), patch_size=15)


def test_keep_equals_reference_filter():
    rng = random.Random(1)
    for i in range(3000):
        w, h = rng.randint(4, 800), rng.randint(4, 800)
        n_boxes = rng.choice([0, 1, 1, 1, 2, 3])
        boxes = []
        for _ in range(n_boxes):
            x0, y0 = rng.randint(0, w - 1), rng.randint(0, h - 1)
            boxes.append((x0, y0, rng.randint(x0, w), rng.randint(y0, h)))
        if i % 10 == 0:  # exactly 25 %: excluded (strictly below is required)
            w, h, boxes = 40, 40, [(0, 0, 20, 20)]
        keep, reason = last_keep(boxes, (w, h))
        assert keep == ref.is_valid_single_object(ref.annotation_xml(w, h, boxes))
        assert (reason is None) == keep
        if len(boxes) > 1:
            assert reason == "several_boxes"
    assert last_keep([(0, 0, 20, 20)], (40, 40)) == (False, "too_large")
    assert last_keep([(0, 0, 19, 20)], (40, 40)) == (True, None)
    assert last_keep([], (40, 40)) == (False, "no_box")


def test_regions_follow_cells_and_reasons():
    boxes = [[(48, 48, 80, 80)], [(0, 0, 100, 100)] * 2, None, [(245, 100, 256, 110)], [(0, 0, 200, 200)]]
    sizes = [(256, 256)] * 5
    inside, reasons = last_regions(boxes, sizes, patch_size=16)
    assert inside.shape == (5, 14, 14)
    assert reasons == [None, "several_boxes", "no_box", None, "too_large"]
    expected = ref.bbox_to_patch_set([48, 48, 80, 80], 256, 256)
    assert set(torch.nonzero(inside[0].flatten()).flatten().tolist()) == expected
    assert not inside[1:].any()  # kept image 3 maps to no cell: stays usable, never a hit


def last_transform(mean, std):
    """The reference's image transform (its ``imagenet_dataloader.py``): torchvision ``Resize(256)`` (bilinear,
    shorter side), ``CenterCrop(224)``, ``ToTensor``, ``Normalize``; interp's ``LAST_PREPROCESS`` must equal it."""
    from torchvision import transforms as T

    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(mean=mean, std=std)])


def test_the_general_eval_transform_is_the_references():
    from conftest import make_model
    from interp.models import preprocessing
    from interp.studies.aggregation.pib_protocol import LAST_PREPROCESS

    model = make_model("vit", depth=1)
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (375, 500, 3), dtype=np.uint8))
    cfg = interp.models.data_config(model)
    ours = preprocessing(model, LAST_PREPROCESS)(img)
    assert torch.allclose(ours, last_transform(cfg["mean"], cfg["std"])(img), atol=1e-6)


def test_transform_crop_matches_box_geometry():
    """A white square drawn on the image lands in the cells the reference geometry predicts."""
    w, h = 512, 384
    img = np.zeros((h, w, 3), np.uint8)
    box = (200, 160, 264, 224)  # scale 256/384; resized 341 x 256; crop offsets (58, 16)
    img[box[1]:box[3], box[0]:box[2]] = 255
    x = last_transform(mean=(0, 0, 0), std=(1, 1, 1))(Image.fromarray(img))
    assert x.shape == (3, 224, 224)
    cells = x[0].reshape(14, 16, 14, 16).mean(dim=(1, 3)) > 0.05  # cells with any bright pixels
    predicted = ref.bbox_to_patch_set(list(box), w, h)
    assert set(torch.nonzero(cells.flatten()).flatten().tolist()) <= predicted
    assert len(predicted - set(torch.nonzero(cells.flatten()).flatten().tolist())) <= 8  # only edge cells differ


# ------------------------------------------------------------------------------ through the study entry point
def test_pib_study_protocol_last_equals_reference(tmp_path):
    """pib_study(protocol="last") on a hooked model: the cell sets are bbox_to_patch_set's, the filters the
    reference dataloader's, the images go through Resize(256) + CenterCrop(224), and each hit is the reference's
    ``top patch in bbox_to_patch_set`` on the same maps."""
    from conftest import make_model
    from interp.studies.core.score_maps import compute_score_maps
    from interp.studies.aggregation.pib import last_protocol_regions, pib_study
    from interp.formats.box_files import read_boxes
    from interp.runtime.open import open_source

    model = make_model("vit", depth=2)  # patch 16, 224 px: the reference's 14 x 14 grid
    rng = np.random.default_rng(0)
    sizes = [(500, 375), (375, 500), (640, 480), (300, 300), (256, 400), (333, 500), (500, 333), (400, 256)]
    boxes = [[(105, 204, 358, 279)], [(10, 20, 60, 90)], [(300, 200, 420, 330)], [(0, 0, 40, 40)],
             [(50, 50, 100, 100), (120, 120, 160, 160)],  # two objects: excluded
             [(10, 10, 300, 450)],                        # 78 % of the image: excluded
             [(0, 100, 30, 200)],                         # left of the crop: clips to the first column
             [(350, 100, 400, 150)]]                      # right of the crop: no cell, stays in the denominator
    rows = ["image,x0,y0,x1,y1,width,height"]
    for i, ((w, h), bs) in enumerate(zip(sizes, boxes)):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"im{i}.png")
        rows += [f"im{i}.png,{x0},{y0},{x1},{y1},{w},{h}" for x0, y0, x1, y1 in bs]
    (tmp_path / "boxes.csv").write_text("\n".join(rows) + "\n")
    source = open_source(model=model, images=str(tmp_path), batch_size=3)
    result = pib_study(source, boxes=tmp_path / "boxes.csv", protocol="last", n_boot=50, progress=False)

    keep = [len(bs) == 1 and (bs[0][2] - bs[0][0]) * (bs[0][3] - bs[0][1]) < 0.25 * w * h
            for (w, h), bs in zip(sizes, boxes)]
    assert keep == [True, True, True, True, False, False, True, True]
    cells = [ref.bbox_to_patch_set(bs[0], w, h) if k else None for (w, h), bs, k in zip(sizes, boxes, keep)]
    regions = last_protocol_regions(source, read_boxes(tmp_path / "boxes.csv"))
    for i, c in enumerate(cells):
        if c is not None:
            assert set(torch.nonzero(regions.inside[i].flatten()).flatten().tolist()) == c
    assert cells[7] == set() and cells[6] and all(v % 14 == 0 for v in cells[6])
    expected_hits = [(p in c) if c is not None else None for p, c in zip(result.top_patch, cells)]
    assert result.hits == expected_hits and result.n_used == 6
    assert result.excluded["several_boxes"] == 1 and result.excluded["too_large"] == 1
    # the maps are those of the reference transform's pixels
    tf = last_transform(source.data_config()["mean"], source.data_config()["std"])
    pixels = torch.stack([tf(Image.open(tmp_path / f"im{i}.png").convert("RGB")) for i in range(len(sizes))])
    maps = compute_score_maps(open_source(model=model, images=pixels), progress=False)
    assert result.top_patch == maps.flatten(1).argmax(1).tolist()
    assert torch.allclose(torch.tensor(result.maps), maps, atol=1e-5)
