"""The selective-cls study end to end (API and CLI), and the CLI of the other lazy-aggregation studies."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import interp.cli
from conftest import make_model
from interp.errors import InterpError
from interp.plots import aggregation as plots
from interp.studies.aggregation.selective_cls import COLUMNS, SelectiveCLSResult, selective_cls_study
from interp.runtime.open import open_source

MODEL_ARGS = ["vit_small_patch16_224", "--no-pretrained", "--depth", "1"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Image-folder layout root/<class>/img.png (labels: the folders name ImageNet classes 285 and 258, in this
    sorted order), 400x300 images, and a CSV box file."""
    root = tmp_path_factory.mktemp("lazy")
    rng = np.random.default_rng(0)
    for cls, folder in (("cat", "Egyptian_cat"), ("dog", "samoyed")):
        (root / "images" / folder).mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "images" / folder / f"{cls}{i}.png")
    (root / "boxes.csv").write_text("image,x0,y0,x1,y1\n"
                                    "cat0.png,100,60,200,150\n"
                                    "cat1.png,150,100,250,200\n"
                                    "samoyed/dog0.png,0,0,60,300\n"    # cropped away by the center crop
                                    "dog1.png,10,10,390,290\n")    # 89 % of the image
    return root


def test_selective_cls_study_table(folder):
    model = make_model("vit", depth=1)
    source = open_source(model=model, images=str(folder / "images"), batch_size=4)
    n = model.layout.n_patches
    result = selective_cls_study(source, boxes=folder / "boxes.csv", ks=[1, n], n_boot=200, seed=0, progress=False)
    assert result.columns == list(COLUMNS) == ["row", "k", "pib", "pib_ci_low", "pib_ci_high", "fg_score_mean",
                                               "bg_score_mean", "top1_agreement", "accuracy"]
    assert [r["row"] for r in result.rows] == ["baseline", "k=1", f"k={n}"]
    assert [r["k"] for r in result.rows] == [None, 1, n]
    assert result.n_used == 2 and result.excluded == {"no_box": 0, "several_boxes": 0, "too_large": 1,
                                                      "cropped_away": 1}
    for row, row_hits in zip(result.rows, result.hits):
        assert set(row) == set(COLUMNS)
        used = [h for h in row_hits if h is not None]
        assert len(used) == 2 and row["pib"] == pytest.approx(float(np.mean(used)))
        assert row["pib_ci_low"] <= row["pib"] <= row["pib_ci_high"]
        assert row["accuracy"] is not None  # labels from the folders, which name ImageNet classes
    # k = n_patches is average pooling: its row equals a direct computation with the mean patch token.
    with torch.no_grad():
        _, x = next(source.image_batches(4))
        _, cache = model.run_with_cache(x, names_filter=["hook_norm_final"])
        patches = cache["hook_norm_final"][:, model.layout.patch_slice]
        scores = torch.nn.functional.cosine_similarity(patches, patches.mean(1, keepdim=True), dim=-1)
        avg_logits = model.timm_model.head(patches.mean(1))
        base_logits = model(x)
    agreement = float((avg_logits.argmax(-1) == base_logits.argmax(-1)).float().mean())
    assert result.rows[2]["top1_agreement"] == agreement
    labels = torch.tensor([285, 285, 258, 258])  # Egyptian cat, Samoyed (the folders' ImageNet-1k classes)
    assert result.rows[0]["accuracy"] == float((base_logits.argmax(-1) == labels).float().mean())
    assert result.rows[2]["accuracy"] == float((avg_logits.argmax(-1) == labels).float().mean())
    # Box cells by hand (Resize 248 + CenterCrop 224 of 400x300: scale 0.825 / 0.8267, offsets 53 / 12):
    # cat0 (100, 60, 200, 150) -> rows 2..6, cols 1..6; cat1 (150, 100, 250, 200) -> x 70.75..153.25 -> cols
    # 4..9, y 70.67..153.33 -> rows 4..9.
    inside = torch.zeros(2, 14, 14, dtype=torch.bool)
    inside[0, 2:7, 1:7] = True
    inside[1, 4:10, 4:10] = True
    top = scores[:2].argmax(1)
    cls_scores = torch.nn.functional.cosine_similarity(patches, cache["hook_norm_final"][:, :1], dim=-1)
    top_cls = cls_scores[:2].argmax(1)
    assert result.hits[0] == [bool(inside[0].flatten()[top_cls[0]]), bool(inside[1].flatten()[top_cls[1]]), None,
                              None]
    assert result.hits[2] == [bool(inside[0].flatten()[top[0]]), bool(inside[1].flatten()[top[1]]), None, None]
    fg = torch.cat([scores[0][inside[0].flatten()], scores[1][inside[1].flatten()]])
    assert result.rows[2]["fg_score_mean"] == pytest.approx(float(fg.mean()), abs=1e-5)
    text = result.table()
    assert text.splitlines()[0].split() == list(COLUMNS) and len(text.splitlines()) == 2 + 3
    result.to_json(folder / "sel.json")
    back = SelectiveCLSResult.from_json(folder / "sel.json")
    assert back.rows == json.loads(json.dumps(result.rows)) and back.distributions[1]["fg"].mean == \
        result.distributions[1]["fg"].mean
    for fig in (plots.pib_bars(result), plots.score_distributions(result)):
        assert len(fig.axes) >= 1
    with pytest.raises(InterpError, match="k must be in"):
        selective_cls_study(source, boxes=folder / "boxes.csv", ks=[n + 1], progress=False)


def test_cli_selective_cls(folder, tmp_path, capsys):
    out = tmp_path / "sel"
    rc = interp.cli.main(["study", "selective-cls", *MODEL_ARGS, "--images", str(folder / "images"),
                          "--boxes", str(folder / "boxes.csv"), "--k", "1", "7", "--n-boot", "100", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == list(COLUMNS)
    data = json.loads((out / "selective_cls.json").read_text())
    assert data["study"] == "selective_cls" and data["columns"] == list(COLUMNS)
    assert [r["row"] for r in data["rows"]] == ["baseline", "k=1", "k=7"]
    assert (out / "pib.png").stat().st_size > 0 and (out / "score_distributions.png").stat().st_size > 0


def test_cli_patch_score_pib_masking(folder, tmp_path, capsys):
    images, boxes = str(folder / "images"), str(folder / "boxes.csv")
    assert interp.cli.main(["study", "patch-score", *MODEL_ARGS, "--images", images, "--boxes", boxes,
                            "--reference", "selective", "--selective-k", "3", "--out", str(tmp_path / "ps")]) == 0
    ps = json.loads((tmp_path / "ps" / "patch_score.json").read_text())
    assert ps["reference"] == "selective" and ps["selective"]["k"] == 3 and len(ps["maps"]) == 4
    assert ps["fg"]["n"] > 0 and (tmp_path / "ps" / "score_maps.png").exists()
    assert interp.cli.main(["study", "pib", *MODEL_ARGS, "--images", images, "--boxes", boxes, "--n-boot", "50",
                            "--out", str(tmp_path / "pib")]) == 0
    pib = json.loads((tmp_path / "pib" / "pib.json").read_text())
    assert pib["n_used"] == 2 and pib["excluded"]["cropped_away"] == 1 and pib["excluded"]["too_large"] == 1
    assert (tmp_path / "pib" / "pib.png").exists() and (tmp_path / "pib" / "score_maps.png").exists()
    assert interp.cli.main(["study", "masking", *MODEL_ARGS, "--images", images, "--fractions", "0", "0.5",
                            "--fill", "blur", "--out", str(tmp_path / "mask")]) == 0
    masking = json.loads((tmp_path / "mask" / "masking.json").read_text())
    assert masking["metric"] == "accuracy" and masking["fractions"] == [0.0, 0.5]
    assert masking["curves"]["top"]["agreement"][0] == 1.0 and masking["blur_sigma"] == 8.0
    assert (tmp_path / "mask" / "masking_curves.png").exists()
    # A bad box file is a clean CLI error (exit code 1), not a traceback.
    (tmp_path / "bad.csv").write_text("image,x0\n")
    assert interp.cli.main(["study", "pib", *MODEL_ARGS, "--images", images, "--boxes", str(tmp_path / "bad.csv"),
                            "--out", str(tmp_path / "bad")]) == 1
    assert "header" in capsys.readouterr().err
