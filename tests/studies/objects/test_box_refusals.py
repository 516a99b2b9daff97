"""Impossible ground truth refused with one line, as PiB refuses it: LOST's boxes (both protocols), COCO polygons
of fewer than 3 points, masks of another size than their image."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_model
from PIL import Image

from interp.cli import main
from interp.errors import InterpError
from interp.studies import open_source
from interp.studies.core.regions import regions_from_masks
from interp.studies.objects.lost import lost_study
from interp.studies.objects.segment import read_coco_polygons, segment_study
from interp.studies.aggregation.pib import pib_study

HEAD = "image,x0,y0,x1,y1\n"
BAD_BOXES = [  # (CSV rows, what the one-line error says)
    ("a.png,0,0,1e300,1e300\n", "reaches far outside its 256 x 256 image"),
    ("a.png,300,300,400,400\n", "lies outside its 256 x 256 image"),
    ("a.png,-500,10,20,30\n", "reaches far outside"),
    ("other.png,10,10,50,50\nnone.png,1,1,2,2\n", "no image matches a key of the box file"),
    ("a.png,0,0,inf,10\n", "finite"),
    ("a.png,20,0,10,10\n", "x1 > x0"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(root / name)
    return root


@pytest.fixture(scope="module")
def model():
    return make_model("vit")


@pytest.mark.parametrize("rows,message", BAD_BOXES)
@pytest.mark.parametrize("protocol", ["model", "lost"])
def test_lost_refuses_what_pib_refuses(tmp_path, folder, model, rows, message, protocol):
    (tmp_path / "b.csv").write_text(HEAD + rows)
    source = open_source(model, images=folder)
    with pytest.raises(InterpError, match=message):
        pib_study(source, boxes=tmp_path / "b.csv", progress=False)
    with pytest.raises(InterpError, match=message):
        lost_study(source, boxes=tmp_path / "b.csv", protocol=protocol, progress=False)


def test_images_without_boxes_are_left_out_as_pib_does(tmp_path, folder, model):
    (tmp_path / "b.csv").write_text(HEAD + "a.png,10,10,200,200\nb.png,,,,\n")
    source = open_source(model, images=folder)
    result = lost_study(source, boxes=tmp_path / "b.csv", progress=False)
    assert result.hits[1] is None and result.n_evaluated == 1
    assert pib_study(source, boxes=tmp_path / "b.csv", max_box_fraction=1, progress=False).excluded["no_box"] == 1


def test_cli_lost_with_an_impossible_box_is_one_line(tmp_path, folder, capsys):
    (tmp_path / "b.csv").write_text(HEAD + BAD_BOXES[0][0])
    rc = main(["study", "lost", "vit_small_patch16_224", "--no-pretrained", "--depth", "1", "--images", str(folder),
               "--boxes", str(tmp_path / "b.csv"), "--out", str(tmp_path / "out"), "--no-progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 1 and len(err) == 1 and err[0].startswith("interp: error: ") and "far outside" in err[0]
    assert not (tmp_path / "out" / "lost.json").exists()


@pytest.mark.parametrize("polygon", [[10, 10, 50], [10, 10, 50, 10], [10, 10, 50, 10, 50, 50, 10]])
def test_coco_polygon_of_fewer_than_three_points_or_odd_is_refused(tmp_path, polygon):
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 256, "height": 256}],
            "annotations": [{"image_id": 1, "segmentation": [polygon]}]}
    (tmp_path / "m.json").write_text(json.dumps(coco))
    with pytest.raises(InterpError, match=f"a polygon of {len(polygon)} numbers"):
        read_coco_polygons(tmp_path / "m.json")


def test_mask_of_another_size_than_its_image_is_refused(tmp_path, folder, model):
    masks = tmp_path / "masks"
    masks.mkdir()
    Image.fromarray(np.full((900, 17), 255, dtype=np.uint8)).save(masks / "a.png")  # 17 wide, 900 tall
    source = open_source(model, images=folder)
    with pytest.raises(InterpError, match=r"17 x 900 pixels but its image .* is 256 x 256"):
        segment_study(source, masks=masks, with_selective=False, progress=False)
    with pytest.raises(InterpError, match=r"17 x 900 pixels but its image"):
        regions_from_masks(source.ids, masks, source.data_config(), tuple(source.layout.grid))


def test_coco_record_of_another_size_than_its_image_is_refused(tmp_path, folder, model):
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 17, "height": 900}],
            "annotations": [{"image_id": 1, "segmentation": [[0, 0, 10, 0, 10, 10]]}]}
    (tmp_path / "m.json").write_text(json.dumps(coco))
    with pytest.raises(InterpError, match=r"17 x 900 pixels but its image"):
        segment_study(open_source(model, images=folder), masks=tmp_path / "m.json", with_selective=False,
                      progress=False)


@pytest.mark.parametrize("segmentation, message", [
    ([], "empty list"),                                            # scored mIoU 1.0
    ([[10, 10, 20, 20, 30, 30]], "polygon 0 has zero area"),       # points on one line: scored mIoU 1.0
    ([[10, 10, 50, 10, 50, 50], [300, 300, 400, 300, 400, 400]], "polygon 1 lies wholly outside its 256 x 256"),
    ([[-50, 10, -10, 10, -10, 50]], "wholly outside"),
    ([[10, 10, 3e9, 10, 3e9, 3e9]], "polygon 0 reaches far outside its 256 x 256"),  # drawn as one pixel: mIoU 0.83
])
def test_coco_annotations_that_mark_no_pixel_are_refused(tmp_path, segmentation, message):
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 256, "height": 256}],
            "annotations": [{"image_id": 1, "segmentation": segmentation}]}
    (tmp_path / "m.json").write_text(json.dumps(coco))
    with pytest.raises(InterpError, match=message):
        read_coco_polygons(tmp_path / "m.json")


def test_cli_segment_with_a_zero_area_polygon_is_one_line(tmp_path, folder, capsys):
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 256, "height": 256}],
            "annotations": [{"image_id": 1, "segmentation": [[10, 10, 10, 10, 10, 10]]}]}
    (tmp_path / "m.json").write_text(json.dumps(coco))
    rc = main(["study", "segment", "vit_small_patch16_224", "--no-pretrained", "--depth", "1", "--images", str(folder),
               "--masks", str(tmp_path / "m.json"), "--out", str(tmp_path / "out"), "--no-progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 1 and len(err) == 1 and "zero area" in err[0], err


def test_a_misspelt_box_key_is_said_not_silently_dropped(tmp_path, folder, model):
    """LOST and PiB evaluated 1 of 2 images without a word when a key was misspelt."""
    (tmp_path / "b.csv").write_text(HEAD + "a.png,10,10,200,200\nbb.png,10,10,200,200\n")
    source = open_source(model, images=folder)
    for run in (lambda: lost_study(source, boxes=tmp_path / "b.csv", progress=False),
                lambda: pib_study(source, boxes=tmp_path / "b.csv", max_box_fraction=1, progress=False)):
        with pytest.warns(UserWarning, match=r"1 image\(s\) have no entry .* 'bb.png' \(did you mean 'b.png'\?\)"):
            run()


def test_keys_of_other_images_are_fine_when_every_image_has_boxes(tmp_path, folder, model, recwarn):
    (tmp_path / "b.csv").write_text(HEAD + "a.png,10,10,200,200\nb.png,1,1,90,90\nc.png,1,1,2,2\n")
    lost_study(open_source(model, images=folder), boxes=tmp_path / "b.csv", progress=False)
    assert not [w for w in recwarn if "box file" in str(w.message)]
