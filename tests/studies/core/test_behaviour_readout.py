"""One behaviour readout, one label rule (``interp.studies.core.behaviour``): a study result and the explorer give
the same agreement, accuracy and note on the same images and classifier; accuracy only when the image folders
name the classifier's classes (ImageNet synset ids or names for a 1000-class head, a file's ``class_names``),
never from a folder's sorted position; the explorer takes the studies' ``--classifier``."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import make_model
from PIL import Image

from interp.cli import main
from interp.explore.session import ExploreOptions, ExploreSession
from interp.models.classifiers.classifier import load_classifier, save_classifier
from interp.studies.artifacts.ablate import ablate_study
from interp.models.classifiers.heads import read_head
from interp.studies.core.behaviour import behaviour_readout, classifier_class_names, target_classes
from interp.runtime.open import open_source
from interp.detection.spec import DetectionSpec

NEURONS = {0: list(range(0, 1536, 3)), 1: list(range(1, 1536, 2))}  # enough to move some argmaxes
SPEC = [{"kind": "NeuronAblation", "neurons": {str(k): v for k, v in NEURONS.items()}}]
pytestmark = pytest.mark.filterwarnings("ignore:no artifacts")  # random weights: no register artifacts
NO_MATCH = "folder names do not match the classifier's class names"


def image_folder(root, names, per_class: int = 2):
    """root/<name>/<i>.png for each of ``names``: an image-folder layout (labels from the folder names)."""
    gen = torch.Generator().manual_seed(0)
    for name in names:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = (torch.rand(40, 40, 3, generator=gen) * 255).byte().numpy()
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def study_and_explorer(model, folder, classifier=None):
    """(the ablation study's target condition and note, the explorer's readout) for the same edit."""
    study = ablate_study(open_source(model=model, images=folder), detection=DetectionSpec(threshold="p99"), neurons=NEURONS, controls=0,
                         classifier=classifier, progress=False)
    session = ExploreSession(model, folder, ExploreOptions(detection=DetectionSpec(threshold="p99"), classifier=classifier))
    return study, session.run(0, SPEC)["readout"]


def assert_same(study, readout):
    target, base = study.conditions["target"], study.conditions["baseline"]
    assert readout["behaviour_note"] == study.behaviour_note
    assert readout["value"] == pytest.approx(target["top1_agreement"], abs=1e-12)
    assert readout["accuracy"] == (None if target["accuracy"] is None else pytest.approx(target["accuracy"]))
    assert readout["baseline_accuracy"] == (None if base["accuracy"] is None else pytest.approx(base["accuracy"]))
    assert readout["metrics"]["pooled_cosine"] == pytest.approx(target["pooled_cosine"], rel=1e-6)


def test_imagenet_folders_give_the_same_accuracy_in_a_study_and_the_explorer(one_thread, tmp_path):
    model = make_model("vit")  # 1000 classes: ImageNet-1k in timm's order
    folder = image_folder(tmp_path / "images", ["n01440764", "goldfish"])  # a synset id and a class name
    study, readout = study_and_explorer(model, folder)
    assert_same(study, readout)
    assert study.behaviour_note is None and readout["accuracy"] is not None
    # the labels are ImageNet classes 0 (tench) and 1 (goldfish), computed here without the readout
    with torch.no_grad():
        x = torch.cat([x for _, x in open_source(model=model, images=folder).image_batches()])
        top1 = model(x).argmax(-1)
    assert study.conditions["baseline"]["accuracy"] == pytest.approx(
        float((top1 == torch.tensor([0, 0, 1, 1])).double().mean()))


def test_folders_that_name_no_class_give_agreement_only_in_both(one_thread, tmp_path):
    model = make_model("vit")
    folder = image_folder(tmp_path / "images", ["class_a", "class_b"])  # the old study read them as classes 0, 1
    study, readout = study_and_explorer(model, folder)
    assert_same(study, readout)
    assert study.conditions["target"]["accuracy"] is None and readout["accuracy"] is None
    assert study.conditions["target"]["top1_agreement"] is not None
    assert NO_MATCH in study.behaviour_note and "'class_a'" in study.behaviour_note
    assert readout["accuracy_note"] == study.behaviour_note


def test_a_classifier_files_class_names_decide_in_both(one_thread, tmp_path):
    model = make_model("vit")
    folder = image_folder(tmp_path / "images", ["cat", "dog"])
    g = torch.Generator().manual_seed(1)
    w = torch.randn(3, 384, generator=g)  # D = the pooled vector of vit_small
    named = save_classifier(tmp_path / "named.pt", "linear", w, torch.zeros(3), class_names=["dog", "fox", "Cat"])
    study, readout = study_and_explorer(model, folder, str(named))
    assert_same(study, readout)
    assert study.behaviour_note is None and readout["accuracy"] is not None and readout["kind"] == "classifier"
    unnamed = save_classifier(tmp_path / "unnamed.pt", "linear", w, torch.zeros(3))
    study, readout = study_and_explorer(model, folder, str(unnamed))
    assert_same(study, readout)
    assert readout["accuracy"] is None and "names no classes" in study.behaviour_note


def test_the_label_rule_by_class_names():
    def folders(names, labels):
        return SimpleNamespace(labels=labels, class_names=names)

    assert target_classes(folders(["Dog", "tabby_cat"], [0, 1, 1]), ["tabby cat", "fox", "dog"]).tolist() == [2, 0, 0]
    assert target_classes(folders(["b", "a"], [1, 0]), ["a", "b"]).tolist() == [0, 1]  # by name, not position
    assert target_classes(folders(["n01", "n02", "n03"], [2, 0]), ["x", "y", "z"]) is None  # a sorted index is no label
    assert target_classes(folders(["3", "7"], [1, 0]), ["a"] * 10) is None  # a number names no class
    assert target_classes(folders(["b", "a"], [1, 0])) is None  # no class names: no labels
    assert target_classes(folders([], None), ["x"]) is None
    model = make_model("vit")
    imagenet, _ = classifier_class_names(read_head(model), None)
    assert target_classes(folders(["n01443537", "Tinca_tinca"], [0, 1]), imagenet).tolist() == [1, 0]
    assert target_classes(folders(["crane"], [0]), imagenet) is None  # the name of two ImageNet classes
    released = load_classifier({"weight": torch.randn(1000, 2 * 384), "bias": torch.zeros(1000)})
    assert classifier_class_names(read_head(model), released)[0] == imagenet  # a DINOv2 released head: ImageNet-1k


def test_a_source_without_folders_says_so(one_thread):
    model = make_model("vit")
    readout = behaviour_readout(open_source(model=model, images=torch.randn(2, 3, 224, 224)))
    assert readout.labels is None and "carry no labels" in readout.note


def test_the_explorer_takes_the_studies_classifier_option(capsys):
    def help_of(argv):
        assert main(argv + ["--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        return text[text.rindex("--classifier FILE"):].split(" --")[0]

    explore, study = help_of(["explore"]), help_of(["study", "ablate"])
    assert explore == study and "top-1 agreement and accuracy" in explore
    assert main(["explore", "--help"]) == 0 and "--head" not in capsys.readouterr().out
