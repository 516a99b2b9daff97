"""Crafted box and mask files are refused with one clear error line naming the record."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from interp.errors import InterpError

from conftest import one_error_line


# ------------------------------------------------------------------------------------------ box and mask files
CSV_HEAD = "image,x0,y0,x1,y1,width,height\n"
BOX_FILE_CASES = {  # name -> (file name, content, message)
    "non-UTF-8 CSV": ("b.csv", (CSV_HEAD + "caf\xe9.jpg,0,0,10,10,20,20\n").encode("latin-1"), "not UTF-8 text"),
    "text width": ("b.csv", CSV_HEAD + "a.jpg,0,0,10,10,wide,20\n", "line 2: width must be a number, got 'wide'"),
    "NaN width": ("b.csv", CSV_HEAD + "a.jpg,0,0,10,10,nan,20\n", "width must be a finite number"),
    "width 0": ("b.csv", CSV_HEAD + "a.jpg,0,0,10,10,0,20\n", "whole pixel counts >= 1"),
    "huge size": ("b.csv", CSV_HEAD + "a.jpg,0,0,10,10,200000,200000\n", "more than 100,000,000"),
    "inf box": ("b.csv", CSV_HEAD + "a.jpg,0,0,inf,10,20,20\n", "x1 must be a finite number"),
    "1e308 box": ("b.csv", CSV_HEAD + "a.jpg,0,0,1e308,10,20,20\n", "reaches far outside its 20 x 20 image"),
    "off-image box": ("b.csv", CSV_HEAD + "a.jpg,30,30,40,40,20,20\n", "lies outside its 20 x 20 image"),
    "zero-size box": ("b.csv", CSV_HEAD + "a.jpg,5,5,5,10,20,20\n", "x1 > x0 and y1 > y0"),
    "negative box": ("b.csv", CSV_HEAD + "a.jpg,9,5,3,10,20,20\n", "x1 > x0 and y1 > y0"),
    "missing column": ("b.csv", "image,x0,y0,x1\na.jpg,0,0,1\n", r"missing \['y1'\]"),
    "boolean coordinate": ("b.json", json.dumps([{"image": "a.jpg", "x0": True, "y0": 0, "x1": 5, "y1": 5}]),
                           "x0 must be a number, got the boolean True"),
    "JSON not a list": ("b.json", json.dumps({"boxes": 3}), "expected a list of box records"),
    "nested JSON": ("b.json", "[" * 100000 + "]" * 100000, "nested too deeply"),
    "COCO no bbox": ("c.json", json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}],
                                           "annotations": [{"image_id": 1}]}), r"'bbox' must be \[x, y, width"),
    "COCO 3-number bbox": ("c.json", json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}],
                                                 "annotations": [{"image_id": 1, "bbox": [1, 2, 3]}]}),
                           r"'bbox' must be \[x, y, width, height\], got \[1, 2, 3\]"),
    "COCO no file_name": ("c.json", json.dumps({"images": [{"id": 1}], "annotations": []}),
                          r"images\[0\] needs 'id' and 'file_name'"),
    "COCO annotations null": ("c.json", json.dumps({"images": [], "annotations": None}),
                              "'annotations' must be a list"),
    "COCO images null": ("c.json", json.dumps({"images": None, "annotations": []}), "'images' must be a list"),
    # issue 53: records keyed xmin/ymin/xmax/ymax were all read as images without a box; pib gave null, exit 0
    "VOC-style keys": ("b.json", json.dumps([{"image": "a.jpg", "xmin": 1, "ymin": 1, "xmax": 9, "ymax": 9}]),
                       "record 0: no x0, y0, x1, y1 but xmax, xmin, ymax, ymin"),
    "no box at all": ("b.csv", CSV_HEAD + "a.jpg,,,,,20,20\nb.jpg,,,,,,\n", r"2 record\(s\) and no box"),
    "COCO without annotations": ("c.json", json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}],
                                                       "annotations": []}), r"1 record\(s\) and no box"),
    "COCO text width": ("c.json", json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "width": "x",
                                                          "height": 4}], "annotations": []}), "width must be a number"),
}


@pytest.mark.parametrize("case", list(BOX_FILE_CASES))
def test_bad_box_files_are_one_line_naming_the_record(tmp_path, case):
    from interp.formats.box_files import read_boxes

    name, content, message = BOX_FILE_CASES[case]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InterpError, match=message) as info:
        read_boxes(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_utf8_bom_csv_reads_its_image_column(tmp_path):
    from interp.formats.box_files import read_boxes

    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (CSV_HEAD + "a.jpg,1,2,5,6,20,20\n").encode())
    table = read_boxes(path)
    assert table["a.jpg"].boxes[0].as_list() == [1, 2, 5, 6] and table["a.jpg"].size == (20, 20)


DATA_CFG = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3,
            "crop_pct": 0.875, "crop_mode": "center"}


@pytest.mark.parametrize("fraction", [-1, 0, float("nan"), 1.5, True])
def test_max_box_fraction_outside_zero_one_is_refused(fraction):
    from interp.formats.box_types import ImageBoxes
    from interp.studies.core.regions import regions_from_boxes

    with pytest.raises(InterpError, match="max_box_fraction=.*give a share of the image area in"):
        regions_from_boxes(["a.jpg"], {"a.jpg": ImageBoxes(size=(20, 20))}, DATA_CFG, (14, 14),
                           max_box_fraction=fraction)


def test_box_outside_the_image_read_from_its_file_is_refused(tmp_path):
    from interp.formats.box_files import read_boxes
    from interp.studies.core.regions import regions_from_boxes

    Image.new("RGB", (40, 30)).save(tmp_path / "a.png")
    (tmp_path / "b.csv").write_text("image,x0,y0,x1,y1\na.png,50,5,60,10\n")  # no size: read from the image
    with pytest.raises(InterpError, match=r"box \[50.0, 5.0, 60.0, 10.0\] lies outside its 40 x 30 image"):
        regions_from_boxes([str(tmp_path / "a.png")], read_boxes(tmp_path / "b.csv"), DATA_CFG, (14, 14))


@pytest.mark.parametrize("content,message", [(b"just text", "cannot read mask"), (None, "cannot read mask")])
def test_text_or_truncated_mask_png(tmp_path, content, message):
    from interp.formats.masks import read_mask

    path = tmp_path / "m.png"
    if content is None:  # a truncated PNG: header fine, pixels cut
        rng = np.random.default_rng(0)
        Image.fromarray((rng.random((64, 64)) > 0.5).astype(np.uint8) * 255).save(path)
        path.write_bytes(path.read_bytes()[:120])
    else:
        path.write_bytes(content)
    with pytest.raises(InterpError, match=message):
        read_mask(path)


@pytest.mark.parametrize("images,anns,message", [
    ([{"id": 1, "file_name": "a.jpg", "width": 200000, "height": 200000}], [], "more than 100,000,000"),
    ([{"id": 1, "file_name": "a.jpg"}], [], r"needs 'width' and 'height'"),
    ([{"id": 1, "file_name": "a.jpg", "width": 4, "height": 4}], None, "'annotations' must be a list"),
    ([{"id": 1, "file_name": "a.jpg", "width": 4, "height": 4}],
     [{"image_id": 1, "segmentation": [[0, 0, "x", 1, 2, 2]]}], "list of polygons"),
])
def test_bad_coco_mask_json(tmp_path, images, anns, message):
    from interp.studies.objects.segment import read_coco_polygons

    path = tmp_path / "masks.json"
    path.write_text(json.dumps({"images": images, "annotations": anns}))
    with pytest.raises(InterpError, match=message):
        read_coco_polygons(path)


@pytest.mark.parametrize("box_line,message", [("a.png,0,0,inf,10,32,32", "finite"),
                                              ("a.png,40,40,50,50,32,32", "outside")])
def test_cli_study_with_a_bad_box_file(tmp_path, capsys, box_line, message):
    from interp.cli import main

    img = tmp_path / "imgs"
    img.mkdir()
    Image.new("RGB", (32, 32), (10, 200, 30)).save(img / "a.png")
    (tmp_path / "boxes.csv").write_text(CSV_HEAD + box_line + "\n")
    rc = main(["study", "pib", "vit_small_patch16_224", "--no-pretrained", "--depth", "1", "--images", str(img),
               "--boxes", str(tmp_path / "boxes.csv"), "--out", str(tmp_path / "out"), "--no-progress"])
    assert rc != 0
    assert message in one_error_line(capsys.readouterr().err)
