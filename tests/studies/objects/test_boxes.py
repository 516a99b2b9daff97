"""Box files and the box -> patch-grid mapping through the model's preprocessing (expected cells by hand)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import interp
from interp.errors import InterpError
from interp.models import data_config, load_images
from interp.formats.box_files import match_boxes, read_boxes
from interp.formats.box_types import Box
from interp.models.inputs.geometry import input_geometry
from interp.models.inputs.preprocessing import timm_transform
from interp.studies.core.regions import box_cells, regions_from_boxes, regions_from_masks


def cells(grid, rows, cols):
    """Expected mask: rows [r0, r1] x cols [c0, c1], inclusive."""
    m = torch.zeros(grid, dtype=torch.bool)
    m[rows[0]:rows[1] + 1, cols[0]:cols[1] + 1] = True
    return m


def mapped_cells(model, image_size, box):
    cfg = data_config(model)
    geometry = input_geometry(timm_transform(cfg), image_size)
    mapped = geometry.to_input(Box(*box))
    if mapped is None:
        return None
    return box_cells(mapped, model.layout.grid, tuple(model.timm_model.patch_embed.patch_size))


@pytest.fixture(scope="module")
def vit16():
    return interp.load("vit_small_patch16_224", pretrained=False, depth=1)


@pytest.fixture(scope="module")
def dino224():
    return interp.load("vit_small_patch14_dinov2", pretrained=False, depth=1, img_size=224)


@pytest.fixture(scope="module")
def dino518():
    return interp.load("vit_small_patch14_dinov2", pretrained=False, depth=1)


def test_box_through_resize_and_center_crop_224_16(vit16):
    # crop_pct 0.9: Resize(floor(224 / 0.9) = 248) of a 400x300 image: h 300 -> 248, w int(248 * 400 / 300) = 330.
    # CenterCrop(224): left = round((330 - 224) / 2) = 53, top = round((248 - 224) / 2) = 12.
    assert data_config(vit16)["crop_pct"] == 0.9
    sx, sy = 330 / 400, 248 / 300
    # Box (100, 60, 200, 150): x 100*0.825-53 = 29.5 .. 165-53 = 112; y 49.6-12 = 37.6 .. 124-12 = 112.
    # 16-px cells: cols floor(29.5/16)=1 .. ceil(112/16)-1=6; rows floor(37.6/16)=2 .. ceil(112/16)-1=6.
    assert abs(100 * sx - 53 - 29.5) < 1e-9 and abs(150 * sy - 12 - 112) < 1e-9
    assert torch.equal(mapped_cells(vit16, (400, 300), (100, 60, 200, 150)), cells((14, 14), (2, 6), (1, 6)))
    # Partly cropped (30, 100, 120, 200): x 24.75-53 < 0 -> 0 .. 99-53 = 46 -> cols 0..2;
    # y 82.67-12 = 70.67 .. 165.33-12 = 153.33 -> rows 4..9.
    assert torch.equal(mapped_cells(vit16, (400, 300), (30, 100, 120, 200)), cells((14, 14), (4, 9), (0, 2)))
    # Fully cropped (0, 0, 60, 300): x1 = 49.5 - 53 = -3.5 < 0.
    assert mapped_cells(vit16, (400, 300), (0, 0, 60, 300)) is None


def test_box_through_resize_and_center_crop_224_14(dino224):
    # crop_pct 1.0: Resize(224) of a 300x450 (w x h) image: w 300 -> 224, h int(224 * 450 / 300) = 336;
    # CenterCrop(224): left 0, top round((336 - 224) / 2) = 56; scale 224/300.
    assert data_config(dino224)["crop_pct"] == 1.0 and dino224.layout.grid == (16, 16)
    # (60, 150, 150, 300): x 44.8 .. 112; y 112-56 = 56 .. 224-56 = 168. 14-px cells: cols 3 .. ceil(8)-1 = 7
    # (112 is exactly a cell border, so col 8 is not touched); rows 56/14 = 4 .. ceil(12)-1 = 11.
    assert torch.equal(mapped_cells(dino224, (300, 450), (60, 150, 150, 300)), cells((16, 16), (4, 11), (3, 7)))
    # Partly cropped (0, 0, 300, 100): y1 = 74.67 - 56 = 18.67 -> rows 0..1, all columns.
    assert torch.equal(mapped_cells(dino224, (300, 450), (0, 0, 300, 100)), cells((16, 16), (0, 1), (0, 15)))
    # Fully cropped above (y1 = 52.27 - 56 < 0) and below (y0 = 283.7 - 56 = 227.7 > 224).
    assert mapped_cells(dino224, (300, 450), (0, 0, 300, 70)) is None
    assert mapped_cells(dino224, (300, 450), (0, 380, 300, 450)) is None


def test_box_through_resize_and_center_crop_518_14(dino518):
    # Default DINOv2 input 518, crop_pct 1.0: 640x480 -> h 518, w int(518 * 640 / 480) = 690; left round(86) = 86.
    assert data_config(dino518)["input_size"] == (3, 518, 518) and dino518.layout.grid == (37, 37)
    sx, sy = 690 / 640, 518 / 480
    # (200, 100, 400, 300): x 215.625-86 = 129.625 .. 431.25-86 = 345.25 -> cols 9 .. ceil(24.66)-1 = 24;
    # y 107.92 .. 323.75 -> rows 7 .. ceil(23.125)-1 = 23.
    assert abs(200 * sx - 86 - 129.625) < 1e-9 and abs(300 * sy - 323.75) < 1e-9
    assert torch.equal(mapped_cells(dino518, (640, 480), (200, 100, 400, 300)), cells((37, 37), (7, 23), (9, 24)))
    # Partly cropped (0, 0, 100, 100): x1 = 107.81 - 86 = 21.81 -> cols 0..1; y1 = 107.92 -> rows 0..7.
    assert torch.equal(mapped_cells(dino518, (640, 480), (0, 0, 100, 100)), cells((37, 37), (0, 7), (0, 1)))
    # Fully cropped on the right: x0 = 625.31 - 86 = 539.3 > 518.
    assert mapped_cells(dino518, (640, 480), (580, 0, 640, 100)) is None


def test_geometry_matches_the_real_preprocessing(vit16, tmp_path):
    # A white box on black, through load_images: the bright input pixels sit where the mapping says.
    img = np.zeros((300, 400, 3), dtype=np.uint8)
    img[60:150, 100:200] = 255
    Image.fromarray(img).save(tmp_path / "a.png")
    x = load_images([tmp_path / "a.png"], vit16)[0, 0]  # normalised: white = 1, black = -1
    bright = (x > 0).nonzero()
    mapped = input_geometry(timm_transform(data_config(vit16)), (400, 300)).to_input(Box(100, 60, 200, 150))
    assert abs(bright[:, 1].min().item() - mapped.x0) <= 1.0 and abs(bright[:, 1].max().item() + 1 - mapped.x1) <= 1.0
    assert abs(bright[:, 0].min().item() - mapped.y0) <= 1.0 and abs(bright[:, 0].max().item() + 1 - mapped.y1) <= 1.0


def test_squash_and_border_crop_modes():
    # squash: Resize((248, 248)) ignores the aspect ratio, then CenterCrop(224): offsets 12, 12.
    cfg = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3,
           "crop_pct": 0.9, "crop_mode": "squash"}
    g = input_geometry(timm_transform(cfg), (400, 300))
    assert (g.scale_x, g.scale_y, g.offset_x, g.offset_y) == (248 / 400, 248 / 300, -12.0, -12.0)
    # border: the longest side 400 -> 248 (ratio max(300/248, 400/248) = 400/248): 248 x round(300/1.6129) = 186,
    # then CenterCropOrPad(224): left round(24 / 2) = 12 cropped, top padded by (224 - 186) // 2 = 19.
    g = input_geometry(timm_transform({**cfg, "crop_mode": "border"}), (400, 300))
    assert g.scale_x == 248 / 400 and g.scale_y == 186 / 300 and g.offset_x == -12.0 and g.offset_y == 19.0


def test_box_file_formats_agree(tmp_path):
    (tmp_path / "b.csv").write_text("image,x0,y0,x1,y1\ncat/a.jpg,1,2,11,22\ncat/a.jpg,5,5,6,6\nb.jpg,,,,\n")
    (tmp_path / "b.json").write_text(json.dumps([
        {"image": "cat/a.jpg", "x0": 1, "y0": 2, "x1": 11, "y1": 22},
        {"image": "cat/a.jpg", "x0": 5, "y0": 5, "x1": 6, "y1": 6}, {"image": "b.jpg"}]))
    (tmp_path / "coco.json").write_text(json.dumps({
        "images": [{"id": 7, "file_name": "cat/a.jpg", "width": 40, "height": 30},
                   {"id": 8, "file_name": "b.jpg", "width": 40, "height": 30}],
        "annotations": [{"image_id": 7, "bbox": [1, 2, 10, 20]}, {"image_id": 7, "bbox": [5, 5, 1, 1]}]}))
    tables = [read_boxes(tmp_path / n) for n in ("b.csv", "b.json", "coco.json")]
    for table in tables:
        assert [b.as_list() for b in table["cat/a.jpg"].boxes] == [[1, 2, 11, 22], [5, 5, 6, 6]]
        assert table["b.jpg"].boxes == []
    assert tables[2]["cat/a.jpg"].size == (40, 30) and tables[0]["cat/a.jpg"].size is None


def test_box_file_errors(tmp_path):
    (tmp_path / "bad.csv").write_text("image,x0,y0,x1,y1\na.jpg,10,0,5,5\n")
    with pytest.raises(InterpError, match="x1 > x0"):
        read_boxes(tmp_path / "bad.csv")
    (tmp_path / "hdr.csv").write_text("file,x0,y0,x1,y1\n")
    with pytest.raises(InterpError, match="header"):
        read_boxes(tmp_path / "hdr.csv")
    with pytest.raises(InterpError, match="does not exist"):
        read_boxes(tmp_path / "missing.json")


def test_keys_match_path_suffixes(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps([{"image": "a.jpg", "x0": 0, "y0": 0, "x1": 1, "y1": 1},
                                                 {"image": "dog/b.jpg", "x0": 0, "y0": 0, "x1": 2, "y1": 2}]))
    table = read_boxes(tmp_path / "b.json")
    found = match_boxes(["/d/cat/a.jpg", "/d/dog/b.jpg", "/d/cat/b.jpg", "/d/cat/c.jpg"], table)
    assert found[0] is table["a.jpg"] and found[1] is table["dog/b.jpg"] and found[2] is None and found[3] is None
    with pytest.raises(InterpError, match="matches two images"):
        match_boxes(["/d/cat/a.jpg", "/d/dog/a.jpg"], table)


def test_filters_and_exclusion_counts(vit16, tmp_path):
    # 400x300 images (area 120000); 25 % = 30000 px^2.
    ids = []
    for name in ("one", "two", "big", "gone", "none", "partial"):
        Image.new("RGB", (400, 300)).save(tmp_path / f"{name}.png")
        ids.append(str(tmp_path / f"{name}.png"))
    (tmp_path / "boxes.csv").write_text(
        "image,x0,y0,x1,y1\n"
        "one.png,100,60,200,150\n"              # 9000 px^2, rows 2..6 x cols 1..6
        "two.png,100,60,200,150\ntwo.png,10,10,20,20\n"
        "big.png,0,0,300,200\n"                 # 60000 px^2 = 50 %
        "gone.png,0,0,60,300\n"                 # cropped away (x1 -> -3.5)
        "partial.png,30,100,120,200\n")         # rows 4..9 x cols 0..2
    table = read_boxes(tmp_path / "boxes.csv")
    cfg = data_config(vit16)
    regions = regions_from_boxes(ids, table, cfg, (14, 14), single_object=True, max_box_fraction=0.25)
    assert regions.reasons == [None, "several_boxes", "too_large", "cropped_away", "no_box", None]
    assert regions.excluded_counts() == {"no_box": 1, "several_boxes": 1, "too_large": 1, "cropped_away": 1}
    assert torch.equal(regions.inside[0], cells((14, 14), (2, 6), (1, 6)))
    assert torch.equal(regions.inside[5], cells((14, 14), (4, 9), (0, 2)))
    y0, y1 = 100 * 248 / 300 - 12, 200 * 248 / 300 - 12
    assert regions.boxes_input[5] == [[0.0, pytest.approx(y0), 46.0, pytest.approx(y1)]]
    assert not regions.inside[1:5].any()
    # Without the filters: both boxes of "two" count (the small one: x 8.25-53 < 0 .. 16.5-53 < 0: cropped off,
    # so only the first remains), and the big box is kept.
    loose = regions_from_boxes(ids, table, cfg, (14, 14), single_object=False, max_box_fraction=None)
    assert loose.reasons == [None, None, None, "cropped_away", "no_box", None]
    assert torch.equal(loose.inside[1], cells((14, 14), (2, 6), (1, 6)))


def test_mask_regions(vit16, dino224, tmp_path):
    # Identity geometry (224x224 image, crop_pct 1): mask pixels rows 30..39, cols 100..119 -> row 2, cols 7..8.
    mask = np.zeros((224, 224), dtype=np.uint8)
    mask[30:40, 100:120] = 255
    (tmp_path / "m").mkdir()
    Image.fromarray(mask).save(tmp_path / "m" / "a.png")
    regions = regions_from_masks(["/x/a.jpg", "/x/b.jpg"], tmp_path / "m", data_config(dino224), (16, 16))
    assert torch.equal(regions.inside[0], cells((16, 16), (2, 2), (7, 8)))
    assert regions.reasons == [None, "no_mask"]
    # A 400x300 mask through Resize(248) + CenterCrop(224): same cells as the box (100, 60, 200, 150).
    mask = np.zeros((300, 400), dtype=np.uint8)
    mask[60:150, 100:200] = 1
    Image.fromarray(mask).save(tmp_path / "m" / "a.png")
    regions = regions_from_masks(["/x/a.jpg"], tmp_path / "m", data_config(vit16), (14, 14))
    assert torch.equal(regions.inside[0], cells((14, 14), (2, 6), (1, 6)))


def test_box_file_that_matches_no_image_is_an_error(vit16, tmp_path):
    (tmp_path / "b.csv").write_text("image,x0,y0,x1,y1\nother.jpg,0,0,5,5\n")
    with pytest.raises(InterpError, match="no image matches"):
        regions_from_boxes(["/d/a.jpg"], read_boxes(tmp_path / "b.csv"), data_config(vit16), (14, 14))
