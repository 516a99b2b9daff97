"""Probes as Darcet et al. (Fig. 5b, Table 1) and the reassessment measure them (issue 16 section 3; issue 15:
the probes take the one detection contract): the pixel probe's L2 error and MSE, outliers decided at a detection
block apart from the probed hook, explicit train/test images, the probe budget and early stopping, and a clear
mark wherever a group has too little data for a number."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import REPO, photo_variants
from test_probes_study import ConstructedReader

import interp
from interp.cli import main
from interp.errors import InterpError
from interp.models import list_images
from interp.studies import CacheSource, open_source, required_hooks
from interp.detection.detection import DetectionSpec
from interp.detection.detection import detect
from interp.studies.core.result import OutlierStudyResult
from interp.studies.probes.split_file import read_split
from interp.studies.probes.scores import PIXEL_SPACE
from interp.studies.probes.probes import ProbesResult, probes_study
from interp.studies.probes.configs import ProbesConfig
from interp.studies.probes.linear_probe import fit_probe
from interp.studies.probes.scores import GroupScore, pixel_errors
from interp.detection.detection import RunOptions

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny probes run faster on one thread

FAST = {"epochs": 2, "min_steps": 30}
SMALL = ["--max-train-tokens", "300", "--max-test-tokens", "100", "--no-progress"]


@pytest.fixture(scope="module")
def planted():
    return interp.load("planted_vit")


# ------------------------------------------------------------------------------ 1. pixels: L2 error and MSE
def test_pixel_errors_are_per_token_l2_and_per_value_mse():
    target = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 1.0]])
    assert pixel_errors(torch.zeros(2, 3), target) == (pytest.approx(3.0), pytest.approx(26 / 6))


def test_pixel_probe_reports_l2_error_and_mse_beside_r2_and_the_figure_draws_the_l2_error():
    from interp.plots.probes import probe_bars

    reader = ConstructedReader(n_images=60)                        # 15 held out: 45 high-norm test tokens
    result = probes_study(CacheSource(reader), detection=DetectionSpec(threshold="auto"), tasks=("pixels",), images=reader.images,
                          progress=False)
    normal, high = result.pixels["normal"], result.pixels["high_norm"]
    assert result.pixel_space == PIXEL_SPACE and "normalised input" in PIXEL_SPACE and result.pixel_values == 12
    assert normal.l2_error < 0.2 * normal.chance_l2_error           # normal tokens hold their pixels ...
    assert high.l2_error > 0.8 * high.chance_l2_error > 5 * normal.l2_error   # ... high-norm ones do not
    assert high.mse * 12 >= 0.999 * high.l2_error ** 2            # mean ||e||^2 / k >= (mean ||e||)^2 / k
    assert normal.score > 0.95 and normal.chance is not None       # R^2 stays, beside the errors
    data = json.loads(result.to_json())
    assert data["pixels"]["high_norm"]["l2_error"] == pytest.approx(high.l2_error) and data["pixel_values"] == 12
    assert data["pixels"]["normal"]["mse"] == pytest.approx(normal.mse) and "normalised" in data["pixel_space"]
    ax = probe_bars(result).axes[0]
    assert [bar.get_height() for bar in ax.patches] == pytest.approx([normal.l2_error, high.l2_error])
    assert "L2 error" in ax.get_ylabel() and "Fig. 5b" in ax.get_title()


# ------------------------------------------------------------------------------ 2. the detection contract
def test_outliers_come_from_the_detection_block_not_from_the_probed_hook(planted, photos16):
    source = open_source(model=planted, images=photos16).held()
    found = detect(source, options=RunOptions(progress=False))      # "auto" on blocks.5.hook_resid_post
    assert found.outliers.any()
    kw = dict(tasks=("position",), probe_options=FAST, max_train_tokens=300, max_test_tokens=100, progress=False)
    result = probes_study(source, hook="hook_norm_final", **kw)         # post-LayerNorm tokens probed
    assert isinstance(result, OutlierStudyResult) and result.hook == "hook_norm_final"
    assert result.high_norm_share == pytest.approx(float(found.outliers.float().mean()))
    assert result.detect_layer == planted.n_layers - 1 and result.threshold == pytest.approx(found.threshold.value)
    assert result.threshold_method == "auto" and "blocks.5.hook_resid_post" in result.outliers_from
    darcet = probes_study(source, detection=DetectionSpec(preset="darcet", detect_layer=3), hook="hook_norm_final",
                          **kw)
    expected = detect(source, DetectionSpec(threshold=150.0, detect_layer=3), RunOptions(progress=False)).outliers
    assert (darcet.preset, darcet.detect_layer, darcet.threshold, darcet.params["threshold"]) == ("darcet", 3, 150.0, 150.0)
    assert darcet.high_norm_share == pytest.approx(float(expected.float().mean()))
    spec = probes_study(source, hook="hook_norm_final", detection=DetectionSpec(threshold="p98", detect_layer=3), **kw)
    assert spec.threshold_method == "percentile" and spec.params["threshold"] == "p98" and spec.detect_layer == 3
    with pytest.raises(InterpError, match="not both"):
        probes_study(source, detection=DetectionSpec(threshold="p98"), outliers=expected, **kw)
    with pytest.raises(InterpError, match="give the detection once"):
        probes_study(source, ProbesConfig(detection=DetectionSpec(detect_layer=2)), detection=found, **kw)


def test_a_cache_for_probes_holds_the_detection_block_too():
    assert required_hooks("probes", 6, {"hook": "hook_norm_final"}) == ["hook_norm_final", "blocks.5.hook_resid_post"]
    assert required_hooks("probes", 6, {"detection": DetectionSpec(preset="jiang-dinov2-l14"), "layer": 2}) == [
        "blocks.2.hook_resid_post", "blocks.4.hook_resid_post"]


def test_cli_detection_flags_and_probe_budget_are_recorded(photos16, tmp_path):
    out = tmp_path / "o"
    assert main(["study", "probes", "planted_vit", "--images", str(photos16), "--out", str(out), "--hook",
                 "hook_norm_final", "--preset", "reassessment", "--tasks", "position", "--epochs", "2",
                 "--min-steps", "20", "--lr", "0.05", "--weight-decay", "0.001", "--ridge", "0.01", *SMALL]) == 0
    data = json.loads((out / "probes.json").read_text())
    assert (data["preset"], data["threshold_method"], data["detect_layer"]) == ("reassessment", "percentile", 5)
    assert data["params"]["threshold"] == "p98" and data["high_norm_share"] == pytest.approx(0.02, abs=0.005)
    options = data["params"]["probe_options"]
    assert (options["epochs"], options["min_steps"], options["lr"], options["weight_decay"], options["ridge"]) == (
        2, 20, 0.05, 0.001, 0.01)
    assert options["patience"] is None and data["training"]["position"]["steps"] == 20


# ------------------------------------------------------------------------------ 3. train and test images
def test_explicit_test_images_replace_the_random_split():
    reader = ConstructedReader(n_images=40)
    source, test = CacheSource(reader), reader.ids[30:]
    kw = dict(tasks=("position",), probe_options=FAST, progress=False)
    result = probes_study(source, test_images=test, **kw)
    assert result.split == "given" and result.test_ids == test and result.params["test_fraction"] is None
    assert (result.n_train_images, result.n_test_images, result.position["high_norm"].n) == (30, 10, 30)
    both = probes_study(source, test_images=test, train_images=reader.ids[:30], **kw)
    assert both.to_dict() == result.to_dict()
    default = probes_study(source, **kw)                      # no sets given: the seeded random split, as before
    assert default.split == "random" and default.n_test_images == 10 and default.params["test_fraction"] == 0.25
    with pytest.raises(InterpError, match="not among the source's 40"):
        probes_study(source, test_images=["nowhere.png"], **kw)
    with pytest.raises(InterpError, match="in both the train and the test set"):
        probes_study(source, test_images=test, train_images=reader.ids[:31], **kw)
    with pytest.raises(InterpError, match="in neither"):
        probes_study(source, test_images=test, train_images=reader.ids[:20], **kw)
    with pytest.raises(InterpError, match="test_fraction applies to the random split"):
        probes_study(source, test_images=test, test_fraction=0.5, **kw)


def test_split_files(tmp_path):
    (tmp_path / "x.png").write_bytes(b"")
    (tmp_path / "s.txt").write_text("split,image\n# a comment\ntrain x.png\ntest,b c.png\ntest\tsub/d.png\n")
    assert read_split(tmp_path / "s.txt") == ([str(tmp_path / "x.png")], ["b c.png", "sub/d.png"])
    (tmp_path / "s.json").write_text(json.dumps({"train": ["a"], "test": ["b"]}))
    assert read_split(tmp_path / "s.json") == (["a"], ["b"])
    (tmp_path / "bad.txt").write_text("train a\nvalidate b\n")
    with pytest.raises(InterpError, match="line 2: 'validate b'"):
        read_split(tmp_path / "bad.txt")
    (tmp_path / "none.txt").write_text("train a\n")
    with pytest.raises(InterpError, match="no test image"):
        read_split(tmp_path / "none.txt")


def test_cli_train_and_test_folders_with_labels_and_early_stopping(tmp_path):
    train = photo_variants(tmp_path / "train", 4, classes=True)     # 16 images of 2 classes
    test = photo_variants(tmp_path / "test", 2, classes=True)       # 8 more
    out = tmp_path / "o"
    assert main(["study", "probes", "planted_vit", "--images", str(train), "--test-images", str(test), "--out",
                 str(out), "--tasks", "position", "label", "--epochs", "3", "--min-steps", "5", "--patience", "2",
                 "--val-fraction", "0.25", *SMALL]) == 0
    result = ProbesResult.from_json(out / "probes.json")
    assert result.split == "given" and sorted(result.test_ids) == sorted(str(p) for p in list_images(test))
    assert (result.n_train_images, result.n_val_images, result.n_test_images) == (12, 4, 8)
    assert result.params["probe_options"]["patience"] == 2 and result.params["probe_options"]["val_fraction"] == 0.25
    assert result.training["position"]["patience"] == 2 and result.training["position"]["val_loss"] is not None
    assert result.label["cls"].n == 8 and result.label["cls"].score is not None   # labels from both folders


def test_cli_split_file_names_the_sets_of_images(photos16, tmp_path):
    names = sorted(p.name for p in list_images(photos16))
    split = tmp_path / "split.txt"
    split.write_text("".join(f"{'test' if i < 4 else 'train'} {n}\n" for i, n in enumerate(names)))
    out = tmp_path / "o"
    assert main(["study", "probes", "planted_vit", "--images", str(photos16), "--split", str(split), "--out",
                 str(out), "--tasks", "position", "--epochs", "1", "--min-steps", "5", *SMALL]) == 0
    result = ProbesResult.from_json(out / "probes.json")
    assert sorted(Path(i).name for i in result.test_ids) == names[:4] and result.n_train_images == 12


@pytest.mark.parametrize("extra, word", [
    (["--val-fraction", "0.2"], "give --patience"),
    (["--test-fraction", "0.3", "--split", "SPLIT"], "--test-fraction sets the random split"),
    (["--test-images", "PHOTOS", "--split", "SPLIT"], "not both"),
])
def test_cli_refuses_image_set_flags_that_do_not_go_together(photos16, tmp_path, capsys, extra, word):
    (tmp_path / "s.txt").write_text("test a.png\n")
    extra = [{"SPLIT": str(tmp_path / "s.txt"), "PHOTOS": str(photos16)}.get(e, e) for e in extra]
    assert main(["study", "probes", "planted_vit", "--images", str(photos16), "--out", str(tmp_path / "o"),
                 *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and word in err


def test_early_stopping_keeps_the_best_pass():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 8, generator=g)
    y = (x[:, 0] > 0).long()
    flipped = (x[:50], 1 - y[:50])  # every pass that learns the training rule makes this validation set worse
    probe = fit_probe(x, y, epochs=50, min_steps=0, batch_size=50, lr=0.1, validation=flipped, patience=3)
    t = probe.training
    assert t["stopped_early"] and t["passes"] == t["best_pass"] + 3 < 50 and t["val_loss"] is not None
    full = fit_probe(x, y, epochs=50, min_steps=0, batch_size=50, lr=0.1)
    assert full.training["passes"] == 50 and not full.training["stopped_early"]
    assert probe.score(x, y) < full.score(x, y)                      # the kept weights are an early pass's
    with pytest.raises(InterpError, match="early stopping needs validation"):
        fit_probe(x, y, patience=2)


# ------------------------------------------------------------------------------ 4. too little data, marked
def test_a_group_with_too_little_data_warns_and_is_marked_everywhere():
    from interp.studies.probes.probes import probe_line
    from interp.plots.probes import probe_bars
    from interp.report.html import _probe_sentence
    from interp.report.summary import probes_summary

    reader = ConstructedReader(n_images=20)
    few = torch.zeros(20, 16, dtype=torch.bool)
    few[:, 0] = True                                                # one high-norm patch per image
    with pytest.warns(UserWarning, match="2 group\\(s\\) not scored, too little data"):
        result = probes_study(CacheSource(reader), outliers=few, tasks=("position", "pixels"), images=reader.images,
                              probe_options=FAST, progress=False)
    high = result.pixels["high_norm"]
    assert (high.score, high.l2_error, high.mse, high.chance_l2_error) == (None, None, None, None) and high.too_few
    assert result.unscored == [f"position/high_norm: {high.note}", f"pixels/high_norm: {high.note}"]
    assert json.loads(result.to_json())["pixels"]["high_norm"]["l2_error"] is None
    summary = probes_summary(result)
    assert summary["pixels"]["high_norm"]["not_scored"] is True and summary["unscored"] == result.unscored
    assert summary["pixels"]["normal"]["not_scored"] is False and summary["pixels"]["normal"]["l2_error"] > 0
    assert "NOT SCORED, too few held-out high-norm tokens" in _probe_sentence("Pixels", summary["pixels"])
    assert probe_line("pixels", high).startswith("NOT SCORED: too few held-out high-norm tokens")
    assert probe_line("pixels", result.pixels["normal"]).startswith("L2 error ")
    fig = probe_bars(result)
    assert all("not scored" in ax.get_xticklabels()[1].get_text() for ax in fig.axes)
    assert "2 group(s) not scored" in fig._suptitle.get_text()


def test_too_few_training_images_on_an_explicit_split_give_the_reason():
    reader = ConstructedReader(n_images=24)
    with pytest.warns(UserWarning, match="no probe scored: too few training images"):
        result = probes_study(CacheSource(reader), test_images=reader.ids[4:], tasks=("position",), progress=False)
    assert result.too_few.startswith("too few training images (4 of 24) for a probe score; need >= 8")
    assert all(g.score is None and g.note == result.too_few for g in result.position.values())


def test_empty_groups_are_not_marked_too_few():
    assert not GroupScore(0, note="empty: no high-norm patch token").too_few
    assert GroupScore(3, note="too few held-out high-norm tokens (n=3)").too_few


# ------------------------------------------------------------------------------ 5. the papers' names
def test_the_probes_name_darcets_fig_5b_and_table_1():
    from interp.plots.probes import PANELS

    root = REPO
    old = "table " + "1b"
    files = [*root.glob("interp/**/*.py"), root / "README.md", *root.glob("docs/**/*.md")]
    assert [str(f) for f in files if old in f.read_text(encoding="utf-8").lower()] == []
    assert "Fig. 5b" in PANELS["position"].title and "Fig. 5b" in PANELS["pixels"].title
    assert "Table 1" in PANELS["label"].title


def test_cli_cache_with_a_split_file_and_its_images_for_the_pixels(photos16, tmp_path):
    names = sorted(p.name for p in list_images(photos16))
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": names[4:], "test": names[:4]}))
    cache = tmp_path / "acts.h5"
    assert main(["cache", "planted_vit", "--images", str(photos16), "--for", "probes", "--out", str(cache),
                 "--no-progress"]) == 0
    out = tmp_path / "o"
    assert main(["study", "probes", "planted_vit", "--cache", str(cache), "--images", str(photos16), "--split",
                 str(split), "--detect-layer", "-1", "--tasks", "position", "pixels", "--epochs", "1",
                 "--min-steps", "5", "--out", str(out), *SMALL]) == 0
    result = ProbesResult.from_json(out / "probes.json")
    assert sorted(Path(i).name for i in result.test_ids) == names[:4] and result.split == "given"
    assert result.pixels["normal"].l2_error is not None and result.detect_layer == 5
