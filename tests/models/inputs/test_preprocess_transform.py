"""Eval preprocessing as the papers' eval (resize N + center crop M) on every study, the report and the cache:
one transform (interp.models.inputs.preprocessing.EvalTransform), recorded where results and caches are written."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import interp
from interp.models import EvalTransform, data_config, eval_transform, preprocessing, sample_image_paths
from interp.studies import open_source

from conftest import make_model


def test_the_transform_resizes_to_n_and_crops_m():
    model = make_model("vit", depth=1, dynamic_img_size=True)
    for resize, crop in ((256, 224), (257, 223), (224, 224), (300, 224), (1000, 224), (4099, 97)):
        tf = preprocessing(model, EvalTransform(resize, crop)).transforms
        assert tf[0].size == resize and tuple(tf[1].size) == (crop, crop)
        assert data_config(model, f"resize{resize}-crop{crop}")["preprocess"] == f"resize{resize}-crop{crop}"


def test_names_and_refusals():
    assert eval_transform("resize256-crop224") == EvalTransform(256, 224)
    assert eval_transform("resize224") == EvalTransform(224, 224)
    assert eval_transform(resize=256, crop=224).name == "resize256-crop224"
    assert eval_transform("model") is None and eval_transform(None) is None
    assert eval_transform("resize256-crop224-bilinear").interpolation == "bilinear"
    for bad, words in (("resize200-crop224", "larger than"), ("crop224", "resizeN-cropM"), ("resize0", ">= 1")):
        with pytest.raises(interp.ImageError, match=words):
            eval_transform(bad)
    with pytest.raises(interp.ImageError, match="not both"):
        eval_transform("resize256-crop224", resize=256)
    with pytest.raises(interp.ImageError, match="needs a resize"):
        eval_transform(crop=224)


def test_dinov2_at_224_in_timm_crops_nothing_while_the_papers_resize_256_crop_224():
    model = make_model("dinov2", depth=1)  # built at 224 px
    own = preprocessing(model).transforms
    assert own[0].size == 224 and tuple(own[1].size) == (224, 224)   # timm: resize 224, no crop margin
    paper = preprocessing(model, "resize256-crop224").transforms
    assert paper[0].size == 256 and tuple(paper[1].size) == (224, 224)
    with pytest.raises(interp.ImageError, match="takes 518 x 518.*--img-size 224"):
        data_config(interp.load("vit_small_patch14_dinov2", pretrained=False, depth=1), "resize256-crop224")


def test_load_images_equals_torchvision_resize_then_center_crop(tmp_path):
    from torchvision import transforms as T

    model = make_model("vit", depth=1)
    cfg = data_config(model)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8))
    img.save(tmp_path / "a.png")
    reference = T.Compose([T.Resize(256, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(224),
                           T.ToTensor(), T.Normalize(cfg["mean"], cfg["std"])])(img)
    ours = interp.load_images([tmp_path / "a.png"], model, preprocess="resize256-crop224")[0]
    assert torch.allclose(ours, reference, atol=1e-6)
    own = interp.load_images([tmp_path / "a.png"], model)[0]   # timm's own: crop_pct 0.9, resize 248
    assert (own - ours).abs().max() > 0.1


def test_a_source_decodes_with_the_transform_and_says_so():
    model = make_model("vit", depth=1)
    paths = sample_image_paths()
    source = open_source(model=model, images=paths, preprocess="resize256-crop224")
    assert source.preprocess == "resize256-crop224" and open_source(model=model, images=paths).preprocess == "model"
    _, x = next(source.image_batches())
    assert torch.equal(x, interp.load_images(paths, model, preprocess="resize256-crop224"))
    assert source.held().preprocess == "resize256-crop224"
    with pytest.raises(interp.InterpError, match="already preprocessed"):
        open_source(model=model, images=torch.zeros(1, 3, 224, 224), preprocess="resize256-crop224")


def test_the_pib_last_protocol_reuses_the_transform():
    from interp.studies.aggregation.pib import last_protocol_source

    model = make_model("vit", depth=1)
    source = last_protocol_source(open_source(model=model, images=sample_image_paths()))
    assert source.preprocess == "resize256-crop224-bilinear"
    with pytest.raises(interp.InterpError, match="leave --resize/--crop/--transform out"):
        last_protocol_source(open_source(model=model, images=sample_image_paths(), preprocess="resize300-crop224"))


def test_a_cache_records_its_transform_and_refuses_a_study_asking_another(tmp_path):
    model = make_model("vit", depth=1)
    path = tmp_path / "a.h5"
    interp.cache.write(model, sample_image_paths(), hooks="blocks.0.hook_resid_post", path=path,
                       preprocess="resize256-crop224", progress=False)
    with interp.cache.open(path) as reader:
        assert reader.meta["data_config"]["preprocess"] == "resize256-crop224"
        live = interp.load_images(sample_image_paths(), model, preprocess="resize256-crop224")
        _, cache = model.run_with_cache(live, names_filter="blocks.0.hook_resid_post")
        stored = torch.as_tensor(reader["blocks.0.hook_resid_post"][0:4]).float()
        assert torch.allclose(stored, cache["blocks.0.hook_resid_post"], atol=2e-2, rtol=1e-2)  # float16 rows
    assert open_source(cache=path, model=model).preprocess == "resize256-crop224"
    assert open_source(cache=path, model=model, preprocess=EvalTransform(256, 224)).preprocess == "resize256-crop224"
    with pytest.raises(interp.InterpError, match="'resize256-crop224' preprocessing, not the 'model' one"):
        open_source(cache=path, model=model, preprocess="model")
    with pytest.raises(interp.InterpError, match="data_config"):   # a resume must use the same transform
        interp.cache.write(model, sample_image_paths(), hooks="blocks.0.hook_resid_post", path=path, resume=True,
                           progress=False)


@pytest.mark.slow
def test_cli_records_the_transform_and_refuses_a_mismatched_cache(tmp_path, capsys):
    from interp.cli import main

    photos, out = "interp/data/samples", tmp_path / "n"
    assert main(["study", "norms", "planted_vit", "--images", photos, "--out", str(out), "--resize", "256",
                 "--crop", "224", "--no-progress"]) == 0
    assert json.loads((out / "norms.json").read_text())["preprocess"] == "resize256-crop224"
    assert main(["cache", "planted_vit", "--images", photos, "--for", "norms", "--out", str(tmp_path / "a.h5"),
                 "--transform", "resize256-crop224", "--no-progress"]) == 0
    assert main(["study", "norms", "planted_vit", "--cache", str(tmp_path / "a.h5"), "--out", str(tmp_path / "c"),
                 "--no-progress"]) == 0
    assert json.loads((tmp_path / "c" / "norms.json").read_text())["preprocess"] == "resize256-crop224"
    capsys.readouterr()
    assert main(["study", "norms", "planted_vit", "--cache", str(tmp_path / "a.h5"), "--out", str(tmp_path / "d"),
                 "--transform", "model"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"interp: error: the cache {str(tmp_path / 'a.h5')!r} was written with the 'resize256-crop224' "
        "preprocessing, not the 'model' one asked for: write a cache with that preprocessing or leave it out"]


def test_cli_refuses_bad_preprocessing_options_before_torch():
    code = ("import sys; from interp.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules, file=sys.stderr); sys.exit(rc)")
    for args, words in ((["--crop", "224"], "--crop 224 needs --resize"),
                        (["--transform", "resize2-crop224"], "larger than"),
                        (["--transform", "model", "--resize", "256"], "not both")):
        run = subprocess.run([sys.executable, "-c", code, "study", "norms", "planted_vit", "--images",
                              "interp/data/samples", "--out", "out/never", *args], capture_output=True, text=True)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and lines[0].startswith("interp: error: ") and words in lines[0], run.stderr
        assert lines[-1] == "False", "torch was imported before the refusal"


def test_the_pixel_probe_reads_a_caches_images_with_its_transform(tmp_path):
    from interp.studies.probes.image_sets import cache_images

    model = make_model("vit", depth=1)
    interp.cache.write(model, sample_image_paths(), hooks="blocks.0.hook_resid_post", path=tmp_path / "a.h5",
                       preprocess="resize256-crop224", progress=False)
    pixels = cache_images(open_source(cache=tmp_path / "a.h5", model=model), "interp/data/samples")
    assert torch.equal(pixels, interp.load_images(sample_image_paths(), model, preprocess="resize256-crop224"))
