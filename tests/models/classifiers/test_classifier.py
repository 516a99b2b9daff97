"""Classifier files and the behaviour meter: class logits through a zero-shot matrix, a linear head or DINOv2's
linear head (equal to the DINOv2 repository's arithmetic); no agreement or accuracy for a projection head
without one; one condition-record shape for every behaviour study; wrong files refused in one line."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import interp
from interp.cli import main
from interp.errors import InterpError
from interp.interventions import NeuronAblation
from interp.models.classifiers.classifier import load_classifier, save_classifier
from interp.studies import open_source
from interp.studies.aggregation.masking import masking_study
from interp.studies.aggregation.selective_cls import selective_cls_study
from interp.studies.artifacts.ablate import ablate_study
from interp.studies.artifacts.registers import registers_study
from interp.studies.artifacts.relocate import relocate_study
from interp.studies.core.behaviour import METRICS
from interp.runtime.forward import run_hooks
from interp.runtime.passes import baseline_pass

from conftest import images
from reference.dinov2_linear_head import linear_head_logits
from interp.detection.spec import DetectionSpec

NEURONS = {0: list(range(0, 256, 2)), 1: list(range(1, 256, 3))}  # enough to move the outputs


def clip_like(seed: int = 0):
    """A small CLIP-style image tower: timm's CLIP ViT config with a 32-d projection head (d = 64, 64 px)."""
    return interp.load("vit_base_patch16_clip_224", pretrained=False, seed=seed, depth=2, embed_dim=64,
                       num_heads=2, num_classes=32, img_size=64)


def small_dinov2(registers: bool):
    name = "vit_small_patch14_reg4_dinov2" if registers else "vit_small_patch14_dinov2"
    model = interp.load(name, pretrained=False, depth=4, img_size=56)
    with torch.no_grad():  # LayerScale starts at 1e-5: make the blocks matter
        for block in model.timm_model.blocks:
            block.ls1.gamma.fill_(0.5)
            block.ls2.gamma.fill_(0.5)
    return model


def labelled_source(model, n: int = 6, seed: int = 1):
    source = open_source(model=model, images=images(n, size=64, seed=seed), batch_size=4)
    source.labels, source.class_names = [i % 3 for i in range(n)], ["cat", "dog", "fox"]
    return source


def zeroshot_file(tmp_path, n_classes: int = 3, dim: int = 32, seed: int = 0, **extra):
    g = torch.Generator().manual_seed(seed)
    w = F.normalize(torch.randn(n_classes, dim, generator=g), dim=-1)
    return save_classifier(tmp_path / "zs.pt", "zeroshot", w, logit_scale=100.0, source="test matrix", **extra), w


# ---------------------------------------------------------------------------------------------- the heads
@pytest.mark.parametrize("registers", [False, True])
@pytest.mark.parametrize("n_blocks", [1, 4])
@pytest.mark.parametrize("released", [True, False])
def test_dinov2_linear_head_equals_the_dinov2_repository(registers, n_blocks, released, tmp_path):
    model = small_dinov2(registers)
    x = images(3, size=56, seed=2)
    g = torch.Generator().manual_seed(n_blocks)
    w, b = 0.05 * torch.randn(7, (n_blocks + 1) * 384, generator=g), torch.randn(7, generator=g)
    if released:  # DINOv2's own head file: a plain state dict, n_blocks read from the width
        torch.save({"weight": w, "bias": b}, tmp_path / "head.pth")
        clf = interp.load_classifier(tmp_path / "head.pth")
    else:
        clf = load_classifier(save_classifier(tmp_path / "head.pt", "dinov2_linear", w, b, n_blocks=n_blocks,
                                              avgpool=True))
    bound = clf.bind(model)
    assert bound.n_blocks == n_blocks and len(bound.hooks()) == n_blocks
    ours = run_hooks(model, x, classifier=bound).logits
    reference = linear_head_logits(model.timm_model, x, w, b, n_blocks)
    assert ours.shape == (3, 7)
    assert (ours - reference).abs().max() <= 1e-5
    assert bound.record()["n_blocks"] == n_blocks and bound.record()["n_classes"] == 7


def test_dinov2_head_without_avgpool_and_its_widths(tmp_path):
    model = small_dinov2(registers=True)
    x = images(2, size=56, seed=3)
    w, b = 0.05 * torch.randn(5, 4 * 384), torch.randn(5)
    clf = load_classifier({"interp_classifier": 1, "kind": "dinov2_linear", "weight": w, "bias": b, "n_blocks": 4,
                           "avgpool": False}).bind(model)
    got = run_hooks(model, x, classifier=clf).logits
    assert (got - linear_head_logits(model.timm_model, x, w, b, 4, avgpool=False)).abs().max() <= 1e-5
    with pytest.raises(InterpError, match=r"D=1000 but .* gives 768 \(1 block\) or 1920 \(4 blocks\)"):
        load_classifier({"weight": torch.randn(3, 1000), "bias": torch.zeros(3)}).bind(model)


def test_linear_head_reads_the_pooled_vector_or_the_head_output_by_width(tmp_path):
    model = clip_like()
    x = images(3, size=64, seed=4)
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names_filter=["hook_pooled", "hook_logits"])
    for dim, hook, chosen in ((64, "hook_pooled", "pooled"), (32, "hook_logits", "head_output")):
        w, b = torch.randn(4, dim), torch.randn(4)
        clf = load_classifier(save_classifier(tmp_path / f"lin{dim}.pt", "linear", w, b)).bind(model)
        expected = cache[hook] @ w.T + b
        assert clf.input == chosen and clf.record()["input"] == chosen
        assert torch.allclose(run_hooks(model, x, classifier=clf).logits, expected, atol=1e-5)


def test_run_hooks_keeps_the_pooled_vector_beside_the_class_logits(tmp_path):
    model = clip_like()
    x = images(2, size=64, seed=5)
    path, w = zeroshot_file(tmp_path)
    run = run_hooks(model, x, ["blocks.1.hook_resid_post"], classifier=interp.load_classifier(path))
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names_filter=["hook_pooled", "hook_logits"])
    assert torch.allclose(run.pooled, cache["hook_pooled"], atol=1e-6)
    assert torch.allclose(run.logits, 100.0 * F.normalize(cache["hook_logits"], dim=-1) @ w.T, atol=1e-4)
    assert run.acts["blocks.1.hook_resid_post"].shape == (2, 17, 64)  # the study's own hook is untouched


# ---------------------------------------------------------------------------------------------- the meter
def test_a_clip_like_head_without_classifier_gets_cosine_and_a_note_never_accuracy():
    model = clip_like()
    source = labelled_source(model)
    result = ablate_study(source, detection=DetectionSpec(threshold="p99"), neurons=NEURONS, controls=1, progress=False)
    target = result.conditions["target"]
    assert target["accuracy"] is None and target["top1_agreement"] is None  # labels exist, but no class logits
    assert result.summary["accuracy"]["baseline"] is None
    assert "CLIP image tower" in result.behaviour_note and "--classifier FILE" in result.behaviour_note
    assert result.classifier["kind"] == "model_head" and result.classifier["head"] == "embedding"
    x = images(6, size=64, seed=1)
    with torch.no_grad():
        _, base = model.run_with_cache(x, names_filter="hook_pooled")
        with model.intervene(NeuronAblation(NEURONS)):
            _, edited = model.run_with_cache(x, names_filter="hook_pooled")
    cos = F.cosine_similarity(edited["hook_pooled"].double(), base["hook_pooled"].double(), dim=-1)
    assert target["pooled_cosine"] == pytest.approx(float(cos.mean()), abs=1e-6) and target["pooled_cosine"] < 1 - 1e-5
    assert target["pooled_cosine_min"] == pytest.approx(float(cos.min()), abs=1e-6)
    assert target["pooled_norm"] == pytest.approx(float(edited["hook_pooled"].norm(dim=-1).mean()), rel=1e-5)
    assert result.conditions["baseline"]["pooled_cosine"] == pytest.approx(1.0)
    from matplotlib.text import Text

    from interp.plots.causal import ablation_bars

    titles = [t.get_text() for t in ablation_bars(result).findobj(Text)]  # the cosine panel, no accuracy panel
    assert "pooled cosine (distance from 1)" in titles and "accuracy" not in titles and "top1 agreement" not in titles


def test_a_zeroshot_file_gives_accuracy_equal_to_a_hand_computation(tmp_path):
    model = clip_like()
    source = labelled_source(model)
    x = images(6, size=64, seed=1)
    with torch.no_grad():  # class embeddings: three images' outputs without their common direction, so the
        out = model(x)     # argmax differs between images (a random matrix gives every image one class here)
    common = F.normalize(out.mean(0), dim=0)
    spread = out - out.mean(0)
    w = F.normalize((spread - (spread @ common)[:, None] * common)[:3], dim=-1)
    path = save_classifier(tmp_path / "zs.pt", "zeroshot", w, logit_scale=100.0, source="test matrix",
                           class_names=["cat", "dog", "fox"])
    result = ablate_study(source, detection=DetectionSpec(threshold="p99"), neurons=NEURONS, controls=1, classifier=str(path), progress=False)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        base = (100.0 * F.normalize(model(x), dim=-1) @ w.T).argmax(-1)
        with model.intervene(NeuronAblation(NEURONS)):
            edited = (100.0 * F.normalize(model(x), dim=-1) @ w.T).argmax(-1)
    target = result.conditions["target"]
    assert target["accuracy"] == float((edited == labels).double().mean())
    assert result.conditions["baseline"]["accuracy"] == float((base == labels).double().mean())
    assert target["top1_agreement"] == float((edited == base).double().mean())
    assert 0 < target["top1_agreement"] < 1 and target["accuracy"] != result.conditions["baseline"]["accuracy"]
    assert result.behaviour_note is None
    record = result.classifier
    assert record["kind"] == "zeroshot" and record["n_classes"] == 3 and record["path"] == str(path)
    assert record["source"] == "test matrix" and len(record["fingerprint"]) == 16


def test_every_behaviour_study_has_one_condition_record_shape(tmp_path):
    model = clip_like()
    source = labelled_source(model, n=4)
    path, _ = zeroshot_file(tmp_path, class_names=["cat", "dog", "fox"])  # the folders name its classes
    neurons = {1: list(range(0, 256, 4))}
    runs = {
        "ablate": lambda c: ablate_study(source, detection=DetectionSpec(threshold="p99"), neurons=neurons, controls=1, classifier=c,
                                         progress=False),
        "registers": lambda c: registers_study(source, detection=DetectionSpec(threshold="p99"), neurons=neurons, classifier=c,
                                               progress=False),
        "relocate": lambda c: relocate_study(source, detection=DetectionSpec(threshold="p99"), neurons=neurons, target=torch.eye(4, dtype=torch.bool), classifier=c, progress=False),
        "masking": lambda c: masking_study(source, fractions=[0.0, 0.5], classifier=c, progress=False),
        "selective_cls": lambda c: selective_cls_study(source, ks=[1, 16], classifier=c, progress=False),
    }
    for study, run in runs.items():
        with_file, without = run(str(path)), run(None)
        for result, has_classes in ((with_file, True), (without, False)):
            assert result.conditions, study
            for name, record in result.conditions.items():
                assert set(METRICS) <= set(record), (study, name)
                assert (record["accuracy"] is not None) == has_classes, (study, name)
                assert -1.0 <= record["pooled_cosine"] <= 1.0 + 1e-9
            assert (result.behaviour_note is None) == has_classes, study
            assert result.classifier["kind"] == ("zeroshot" if has_classes else "model_head"), study
    registers = runs["registers"](None)
    assert registers.with_register == registers.conditions["with_register"]  # the old field is kept
    masking = runs["masking"](None)
    assert masking.metric == "pooled_cosine" and masking.curves["top"]["accuracy"] is None
    assert masking.curves["top"]["pooled_cosine"][0] == pytest.approx(1.0)
    table = runs["selective_cls"](None).table()
    assert "pooled_cosine" in table.splitlines()[0] and "accuracy" not in table.splitlines()[0]


def test_a_baseline_made_with_another_classifier_is_refused(tmp_path):
    model = clip_like()
    source = labelled_source(model, n=2)
    path, _ = zeroshot_file(tmp_path)
    base = baseline_pass(source, 1, progress=False)
    assert base.pooled.shape == (2, 64) and base.classifier is None
    with pytest.raises(InterpError, match="another classifier"):
        registers_study(source, detection=DetectionSpec(threshold="p99", detect_layer=1), neurons={1: [0, 1]}, baseline=base,
                        classifier=str(path), progress=False)


def test_folder_labels_follow_the_classifiers_class_names():
    from types import SimpleNamespace

    from interp.studies.core.behaviour import target_classes

    def folders(names, labels):
        return SimpleNamespace(labels=labels, class_names=names)

    assert target_classes(folders(["Dog", "tabby_cat"], [0, 1, 1]), ["tabby cat", "fox", "dog"]).tolist() == [2, 0, 0]
    assert target_classes(folders(["3", "7"], [1, 0]), ["a"] * 10) is None                   # a number names nothing
    assert target_classes(folders(["n01", "n02", "n03"], [2, 0]), ["x", "y", "z"]) is None   # nor a sorted index
    assert target_classes(folders(["n01", "n02"], [1, 0]), ["x", "y", "z"]) is None          # names nothing
    assert target_classes(folders(["b", "a"], [1, 0])) is None                               # no class names
    assert target_classes(folders([], None), ["x"]) is None


# ---------------------------------------------------------------------------------------------- bad files
def test_bad_classifier_files_are_refused_in_one_line(tmp_path):
    model = clip_like()
    cases = {
        "unknown kind": ({"interp_classifier": 1, "kind": "softmax", "weight": torch.randn(2, 32)},
                         "unknown classifier kind 'softmax'"),
        "not a classifier": ({"model": torch.randn(2, 2)}, "is not a classifier file"),
        "NaN": ({"interp_classifier": 1, "kind": "linear", "weight": torch.full((2, 32), float("nan"))},
                "NaN or infinite"),
        "no scale": ({"interp_classifier": 1, "kind": "zeroshot", "weight": F.normalize(torch.randn(2, 32), dim=-1)},
                     "needs 'logit_scale'"),
    }
    for name, (data, words) in cases.items():
        torch.save(data, tmp_path / f"{name}.pt")
        with pytest.raises(InterpError, match=words) as e:
            load_classifier(tmp_path / f"{name}.pt")
        assert "\n" not in str(e.value), name
    (tmp_path / "text.pt").write_text("not a tensor file")
    with pytest.raises(InterpError, match="is not a classifier file"):
        load_classifier(tmp_path / "text.pt")
    with pytest.raises(InterpError, match=r"has D=512 but vit_base_patch16_clip_224 outputs 32-d"):
        load_classifier(zeroshot_file(tmp_path, dim=512)[0]).bind(model)
    with pytest.raises(InterpError, match=r"D=50 but .*pooled vector is 64-d and its head output 32-d"):
        load_classifier({"interp_classifier": 1, "kind": "linear", "weight": torch.randn(2, 50)}).bind(model)


def test_cli_classifier_option_runs_and_refuses_a_wrong_width(tmp_path, capsys, labelled16):
    planted = interp.load("planted_vit")  # pooled vector and head output: 192-d and 10-d
    w, b = torch.randn(2, 192), torch.zeros(2)
    good = save_classifier(tmp_path / "lin.pt", "linear", w, b, class_names=["a", "b"])
    common = ["planted_vit", "--images", str(labelled16), "--neurons", "2:17,2:101", "--batch-size", "8"]
    assert main(["study", "registers", *common, "--out", str(tmp_path / "o"), "--classifier", str(good)]) == 0
    saved = json.loads((tmp_path / "o" / "registers.json").read_text())
    assert saved["classifier"]["kind"] == "linear" and saved["classifier"]["input"] == "pooled"
    assert saved["conditions"]["with_register"]["accuracy"] is not None and saved["behaviour_note"] is None
    assert "behaviour through the linear classifier" in capsys.readouterr().out
    del planted
    bad = save_classifier(tmp_path / "bad.pt", "linear", torch.randn(2, 100))
    for argv in (["study", "ablate", *common, "--out", str(tmp_path / "a")], ["report", "--out", str(tmp_path / "r")]):
        assert main([*argv, "--classifier", str(bad)]) == 1
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 1 and errors[0].startswith("interp: error:"), errors  # one line, no traceback
        assert "D=100" in errors[0] and "192-d" in errors[0] and "10-d" in errors[0]
