"""LOST's own protocol (``protocol="lost"``): full-resolution input, DINO's per-image position table, LOST's
ground-truth conventions and CorLoc, compared with the oracle transcribed from ``valeoai/LOST`` and DINO."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import interp
from interp.cli import main
from interp.errors import InterpError
from interp.models.weights.pos_table import dino_pos_table, input_grid
from interp.studies import open_source
from interp.runtime.forward import run_hooks
from interp.formats.box_files import read_boxes
from interp.studies.objects.lost import LostResult, degree_order, lost_study
from interp.studies.objects.lost_protocol import lost_box, lost_input, lost_iou
from reference import lost_protocol as ref
from reference.lost_object_discovery import lost as reference_lost

SIZES = [(70, 45), (64, 64), (33, 50), (100, 37)]  # (width, height): padded, exact, tall, wide


def dino_model(depth: int = 2):
    torch.manual_seed(0)
    return interp.load("vit_small_patch16_224.dino", pretrained=False, seed=0, depth=depth)


def write_images(folder, sizes=SIZES, seed=0):
    """Smooth random images (blobs, so the keys are not all alike) of the given sizes -> paths."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i, (w, h) in enumerate(sizes):
        base = rng.integers(0, 255, (max(h // 8, 1), max(w // 8, 1), 3), dtype=np.uint8)
        im = Image.fromarray(base).resize((w, h), Image.BILINEAR)
        paths.append(folder / f"im{i}.png")
        im.save(paths[-1])
    return paths


def test_input_is_lost_transform_zero_padded(tmp_path):
    for path, (w, h) in zip(write_images(tmp_path), SIZES):
        x, size = lost_input(path, 16)
        want, init = ref.padded_input(Image.open(path), 16)
        assert size == (w, h) and tuple(init[1:]) == (h, w)
        assert x.shape == want.shape and x.shape[1] % 16 == 0 and x.shape[2] % 16 == 0
        assert torch.allclose(x, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("grid", [(14, 14), (20, 31), (7, 28), (3, 5), (28, 7)])
def test_position_table_is_dinos(grid):
    g = torch.Generator().manual_seed(1)
    table = torch.randn(1, 1 + 14 * 14, 32, generator=g)  # not smooth: the sample positions matter
    ours = dino_pos_table(table, (14, 14), grid)
    tokens = torch.zeros(1, 1 + grid[0] * grid[1], 32)
    want = ref.interpolate_pos_encoding(table, 16, tokens, grid[0] * 16, grid[1] * 16)
    assert ours.shape == want.shape
    assert torch.allclose(ours, want, atol=1e-5, rtol=0)
    if grid != (14, 14):  # timm's resampling (size=, antialias) is another table
        from timm.layers import resample_abs_pos_embed
        timm_table = resample_abs_pos_embed(table, list(grid), old_size=[14, 14], num_prefix_tokens=1)
        assert (timm_table - want).abs().max() > 1e-2


def test_keys_at_full_resolution_equal_dinos_forward(tmp_path):
    model = dino_model()
    for path in write_images(tmp_path)[:3]:
        x, _ = lost_input(path, 16)
        grid = (x.shape[1] // 16, x.shape[2] // 16)
        with input_grid(model, grid):
            run = run_hooks(model, x[None], ["blocks.1.attn.hook_k"])
        keys = run.acts["blocks.1.attn.hook_k"]
        ours = keys.reshape(1, keys.shape[1], -1)[:, 1:]
        want = ref.last_keys(model.timm_model, x[None])
        scale = want.abs().max()
        assert ours.shape == want.shape and (ours - want).abs().max() <= 1e-5 * scale
    assert tuple(model.timm_model.pos_embed.shape) == (1, 197, 384)  # restored
    assert tuple(model.timm_model.patch_embed.img_size) == (224, 224)


def voc_xml(name, size, objects):
    objs = "".join(f"<object><name>a</name><difficult>{d}</difficult><bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin>"
                   f"<xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>" for b, d in objects)
    return (f"<annotation><filename>{name}</filename><size><width>{size[0]}</width><height>{size[1]}</height>"
            f"<depth>3</depth></size>{objs}</annotation>")


def test_boxes_and_corloc_equal_the_reference_pipeline(tmp_path):
    paths = write_images(tmp_path / "images")
    ann = tmp_path / "Annotations"
    ann.mkdir()
    gt_objects = {  # VOC's 1-based inclusive corners; some near, some far from what LOST finds
        0: [((1, 1, 70, 45), "0")], 1: [((5, 5, 30, 30), "1"), ((1, 1, 64, 64), "0")],
        2: [((2, 3, 20, 25), "0")], 3: [((50, 1, 100, 37), "0")]}
    for i, (p, size) in enumerate(zip(paths, SIZES)):
        (ann / f"im{i}.xml").write_text(voc_xml(p.name, size, gt_objects[i]))
    model = dino_model()
    result = lost_study(open_source(model, images=tmp_path / "images"), boxes=ann, protocol="lost", progress=False)
    assert result.protocol == "lost" and result.grid == [] and result.n_evaluated == 4
    for i, p in enumerate(paths):
        x, init = ref.padded_input(Image.open(p), 16)
        grid = [x.shape[1] // 16, x.shape[2] // 16]
        box_cells, seed, _ = reference_lost(ref.last_keys(model.timm_model, x[None]), grid)
        pred = ref.detect_box_pixels(box_cells, 16, init)
        gt = ref.extract_gt_voc([{"bndbox": dict(zip(("xmin", "ymin", "xmax", "ymax"), map(str, b)))}
                                 for b, _ in gt_objects[i]])
        assert result.grids[i] == grid and result.seeds[i] == seed
        assert result.boxes[i] == [float(v) for v in pred]
        assert result.hits[i] == ref.corloc_hit(pred, gt)
    assert result.corloc == sum(result.hits) / 4


def test_lost_iou_is_bbox_iou():
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        a = torch.randint(0, 60, (2,), generator=g)
        box = [int(a[0]), int(a[1]), int(a[0]) + 1 + int(torch.randint(0, 60, (1,), generator=g)),
               int(a[1]) + 1 + int(torch.randint(0, 60, (1,), generator=g))]
        gt = torch.randint(0, 60, (3, 2), generator=g)
        gts = [[int(r[0]), int(r[1]), int(r[0]) + 5, int(r[1]) + 9] for r in gt]
        want = ref.bbox_iou(torch.tensor(box), torch.tensor(gts)).tolist()
        assert lost_iou(box, gts) == pytest.approx(want, abs=1e-7)


def test_box_is_clipped_to_the_unpadded_image():
    assert lost_box([0, 0, 5, 3], 16, (70, 45)) == [0.0, 0.0, 70.0, 45.0]
    assert ref.detect_box_pixels([0, 0, 5, 3], 16, (3, 45, 70)) == [0, 0, 70, 45]


def test_voc_xml_reader_converts_to_pixel_edges_and_keeps_difficult(tmp_path):
    (tmp_path / "a.xml").write_text(voc_xml("a.jpg", (500, 375), [((1, 1, 500, 375), "0"), ((10, 20, 30, 40), "1")]))
    table = read_boxes(tmp_path / "a.xml")
    assert table["a.jpg"].size == (500, 375)
    assert [b.as_list() for b in table["a.jpg"].boxes] == [[0, 0, 500, 375], [9, 19, 30, 40]]
    assert read_boxes(tmp_path)["a.jpg"].boxes == table["a.jpg"].boxes  # a folder of them
    gt = ref.extract_gt_voc([{"bndbox": {"xmin": "10", "ymin": "20", "xmax": "30", "ymax": "40"}}])
    assert gt == [[9, 19, 30, 40]]


@pytest.mark.parametrize("text", [
    '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "y">]><annotation><filename>&x;</filename></annotation>',
    "<annotation><filename>a.jpg</filename><object><bndbox><xmin>1</xmin></bndbox></object></annotation>",
    "<annotation><filename>a.jpg</filename>",
    "<notvoc/>"])
def test_voc_xml_refusals(tmp_path, text):
    (tmp_path / "a.xml").write_text(text)
    with pytest.raises(InterpError):
        read_boxes(tmp_path / "a.xml")
    (tmp_path / "a.xml").write_bytes(text.encode("utf-16"))  # another encoding hides nothing
    with pytest.raises(InterpError):
        read_boxes(tmp_path / "a.xml")


def test_coco_lost_convention_drops_crowd_and_rounds(tmp_path):
    objects = [{"id": 1, "image_id": 7, "bbox": [10.4, 20.5, 30.2, 40.7], "iscrowd": 0, "category_id": 1},
               {"id": 2, "image_id": 7, "bbox": [0, 0, 50, 50], "iscrowd": 1, "category_id": 1}]
    coco = {"images": [{"id": 7, "file_name": "a.jpg", "width": 100, "height": 100}], "annotations": objects}
    (tmp_path / "c.json").write_text(json.dumps(coco))
    assert len(read_boxes(tmp_path / "c.json")["a.jpg"].boxes) == 2
    lost = read_boxes(tmp_path / "c.json", convention="lost")["a.jpg"].boxes
    assert [b.as_list() for b in lost] == ref.extract_gt_coco(objects) == [[10, 20, 41, 61]]


def test_coco_lost_convention_keeps_the_file_when_a_sub_pixel_box_rounds_to_nothing(tmp_path):
    objects = [{"id": 1, "image_id": 7, "bbox": [10.4, 20.5, 30.2, 40.7], "iscrowd": 0, "category_id": 1},
               {"id": 2, "image_id": 7, "bbox": [5.1, 5.1, 0.2, 0.2], "iscrowd": 0, "category_id": 1}]
    coco = {"images": [{"id": 7, "file_name": "a.jpg", "width": 100, "height": 100}], "annotations": objects}
    (tmp_path / "c.json").write_text(json.dumps(coco))
    lost = read_boxes(tmp_path / "c.json", convention="lost")["a.jpg"].boxes  # LOST's box [5, 5, 5, 5] never hits
    assert [b.as_list() for b in lost] == [[10, 20, 41, 61]]


def test_ties_torch_is_the_reference_call():
    degrees = torch.tensor([3, 1, 1, 2, 1, 3, 0, 1])
    assert degree_order(degrees).tolist() == [6, 1, 2, 4, 7, 3, 0, 5]
    assert torch.equal(degree_order(degrees, "torch"), torch.argsort(-degrees.float(), descending=True))
    with pytest.raises(InterpError):
        degree_order(degrees, "random")


def test_cli_protocol_lost_and_its_refusals(tmp_path, capsys):
    write_images(tmp_path / "images")
    out = tmp_path / "out"
    args = ["study", "lost", "vit_small_patch16_224.dino", "--no-pretrained", "--depth", "2",
            "--images", str(tmp_path / "images"), "--no-progress"]
    assert main(args + ["--protocol", "lost", "--out", str(out)]) == 0
    result = LostResult.from_json(out / "lost.json")
    assert result.protocol == "lost" and [list(s) for s in result.image_sizes] == [list(s) for s in SIZES]
    assert result.params["pos_table"] == {"offset": 0.1, "antialias": False}
    assert (out / "lost_boxes.png").exists()
    assert main(args + ["--protocol", "lost", "--resize", "256", "--crop", "224", "--out", str(tmp_path / "o2")]) == 2
    assert "full-resolution" in capsys.readouterr().err


def test_protocol_lost_with_a_test_time_register(tmp_path):
    from interp.interventions import TestTimeRegister

    write_images(tmp_path / "images", SIZES[:2])
    model = dino_model(depth=3)
    source = open_source(model, images=tmp_path / "images")
    result = lost_study(source, protocol="lost", intervention=TestTimeRegister({1: [5, 17]}), progress=False)
    assert result.intervention["kind"] == "TestTimeRegister" and len(result.edited["box_cells"]) == 2
    assert [list(np.shape(m)) for m in result.edited["masks"]] == result.grids
    with pytest.raises(InterpError, match="full-resolution|full resolution"):
        lost_study(source.with_preprocess("resize256-crop224"), protocol="lost", progress=False)
