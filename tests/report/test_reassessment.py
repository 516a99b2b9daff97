"""The reassessment table (interp.report.reassessment, ``interp reassess``): on the planted models of each family
the rows show the planted artifacts' properties; random models of each family say "no artifacts"; what is not
defined says n/a and why."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import interp
from interp.cli import main
from interp.errors import InterpError
from interp.models import sample_image_paths
from interp.report.reassessment import (ReassessSettings, ReassessmentResult, reassess_models, register_siblings,
                                       sibling_pairs)
from interp.report.reassessment_cells import ARTIFACT_ROWS, NO_ARTIFACTS, ROWS
from interp.report.reassessment_figure import reassessment_figure

PLANTED = ("planted_vit", "planted_dinov3", "planted_pvt", "planted_swin")
RANDOM = {  # one random model per family, small: none has artifacts
    "vit": ("vit_small_patch16_224", dict(img_size=64, depth=2)),
    "dinov2": ("vit_small_patch14_dinov2", dict(img_size=56, depth=2)),
    "dinov2_reg": ("vit_small_patch14_reg4_dinov2", dict(img_size=56, depth=2)),
    "pvt": ("pvt_v2_b0", dict(img_size=64)),
    "swin": ("swinv2_tiny_window8_256", dict(img_size=64, embed_dim=24, depths=(2, 2, 2, 2), num_heads=(1, 2, 3, 4),
                                             window_size=4)),
}
SETTINGS = ReassessSettings(probe_tokens=400, probe_options={"min_steps": 30}, progress=False)


@pytest.fixture(scope="module")
def table(photos16):
    """The table of the three planted models and the random ones over 16 photos (the test-time register of
    planted_vit and planted_dinov3 runs; planted_dinov3 stands in as planted_vit's "trained-register sibling",
    which exercises the pairing on two models that both have artifacts)."""
    models = [interp.load(name) for name in PLANTED]
    models += [interp.load(name, pretrained=False, **kw) for name, kw in RANDOM.values()]
    names = list(PLANTED) + list(RANDOM)
    return reassess_models(models, photos16, SETTINGS, names=names, siblings={"planted_dinov3": "planted_vit"})


def test_planted_models_show_their_artifacts(table):
    for name in PLANTED:
        assert table.cell("artifacts", name).text == "yes"
        assert table.cell("share", name).values["share"] > 3  # percent of the patches
        assert table.cell("norm_ratio", name).values["ratio"] > 3
        redundancy = table.cell("redundancy", name).values
        assert redundancy["high_norm"] > redundancy["normal"]  # planted on flat, redundant regions
    # what a planted ViT's high-norm tokens hold: its pixels, as normal ones do (scored, not "-")
    pixels = table.cell("pixel_probe", "planted_vit").values
    assert pixels["normal"] is not None and pixels["high_norm"] is not None
    assert 0 < table.cell("position_probe", "planted_vit").values["chance"] < 0.05  # chance level in the cell


def test_random_models_of_every_family_have_no_artifacts(table):
    for name in RANDOM:
        assert table.cell("artifacts", name).text == "no"
        assert table.cell("share", name).values["share"] == 0
        for row in ARTIFACT_ROWS:
            assert table.cell(row, name).text == NO_ARTIFACTS, (name, row)


def test_test_time_register_cleans_the_attention_map(table):
    for name in ("planted_vit", "planted_dinov3"):
        cell = table.cell("ttr_attention", name)
        # without: CLS attends to the planted sinks; with: as much as a uniform map would put there
        assert cell.values["without"] > 0.8 > 0.3 > cell.values["with"]
        assert cell.values["with"] == pytest.approx(cell.values["uniform"], abs=0.05)
        behaviour = table.cell("ttr_behaviour", name)
        assert "pooled cosine" in behaviour.text and behaviour.values["with"] > 0.99  # random head: no classes
        assert "no top-1 agreement or accuracy" in behaviour.why
        assert table.register_neurons[name]  # the planted neurons it edited
    # a pyramid model: no place for a register token, said in one line
    for row in ("ttr_attention", "ttr_behaviour"):
        for name, family in (("planted_pvt", "PVTv2"), ("planted_swin", "Swin-v2")):
            cell = table.cell(row, name)
            assert cell.text == "n/a" and cell.why.startswith(f"test-time registers are not defined here: {family}")


def test_trained_register_siblings(table):
    pair = table.cell("trained_attention", "planted_vit")
    assert table.cell("trained_attention", "planted_dinov3").values == pair.values  # both columns show the pair
    assert pair.values["without"] > 0.8 and pair.why == "planted_vit -> planted_dinov3"
    assert table.siblings == {"planted_dinov3": "planted_vit"}
    accuracy = table.cell("trained_accuracy", "planted_vit")
    assert accuracy.text == "n/a" and accuracy.why.startswith("accuracy needs class logits and labelled images")
    assert table.cell("trained_attention", "planted_pvt").why.startswith("no register sibling among the models")
    assert register_siblings(["vit_small_patch14_dinov2", "x", "vit_small_patch14_reg4_dinov2"]) == {2: 0}
    with pytest.raises(InterpError, match="not one of the models"):
        sibling_pairs(["a", "b"], ["a", "b"], {"a": "c"})
    with pytest.raises(InterpError, match="paired with itself or twice"):
        sibling_pairs(["a", "b"], ["a", "b"], {"a": "a"})


def test_label_probe_says_why_it_has_no_number(table):
    cell = table.cell("label_probe", "planted_vit")
    assert cell.values["normal"] is None and cell.why == (
        "the images carry no labels (an image-folder layout DIR/<class>/img gives them)")


def test_table_json_and_figure(table, tmp_path):
    text = table.table()
    assert text.splitlines()[0].split()[:2] == ["claim", "figure"]
    assert len([line for line in text.splitlines() if line[:1] and line[:1] in "2345"]) == len(ROWS)
    assert "- planted_pvt, ttr_attention: test-time registers are not defined here" in text
    markdown = table.table(markdown=True)
    assert markdown.startswith("| claim | figure | planted_vit |")
    assert "| 3 | redundancy normal / high-norm |" in markdown
    back = ReassessmentResult.from_dict(json.loads(json.dumps(table.to_dict())))
    assert back.cell("ttr_attention", "planted_vit").values == table.cell("ttr_attention", "planted_vit").values
    assert back.table() == text
    reassessment_figure(table).savefig(tmp_path / "r.png")


def test_reassess_cli(tmp_path, capsys):
    args = ["reassess", "planted_vit", "vit_small_patch16_224", "--no-pretrained", "--img-size", "-", "64",
            "--no-probes", "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "test-time register: CLS attention on artifacts" in out and NO_ARTIFACTS in out
    assert "- planted_vit, position_probe: probes not run (--no-probes)" in out
    data = json.loads((tmp_path / "reassess.json").read_text())
    assert data["study"] == "reassess" and data["models"] == ["planted_vit", "vit_small_patch16_224"]
    assert [Path(i).name for i in data["ids"]] == [p.name for p in sample_image_paths()]  # not [] (issue 52)
    assert (tmp_path / "reassess.md").read_text().startswith("| claim |") and (tmp_path / "reassess.png").exists()
    assert main(args) == 1 and "already exists" in capsys.readouterr().err
    assert main(args[:-3] + ["--siblings", "2:1"]) == 2
    assert "--siblings: '2:1' is not REG=PLAIN" in capsys.readouterr().err
    assert main(args[:-3] + ["--siblings", "3=1"]) == 2
    assert "neither a model nor a position 1..2" in capsys.readouterr().err


def test_attention_on_artifacts_is_the_patch_share_of_the_cls_row():
    import torch

    from interp.studies.core.stats import attention_on_artifacts

    # image 0: 0.4 of the row on the patches (the rest on CLS / registers), 0.2 of it on the one outlier patch;
    # image 1 has no outlier: left out
    attention = torch.tensor([[0.2, 0.1, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]])
    outliers = torch.tensor([[True, False, False, False], [False] * 4])
    shares, patch_shares = attention_on_artifacts(attention, outliers)
    assert shares == pytest.approx([0.5]) and patch_shares == pytest.approx([0.25])


def test_a_classifier_file_gives_claim_5_its_accuracy(labelled16, tmp_path, capsys):
    """With a classifier that names the image folders' classes (a, b), claim 5's behaviour is accuracy."""
    import torch

    from interp.models.classifiers.classifier import save_classifier

    model = interp.load("planted_vit")
    width = model.run_with_cache(torch.zeros(1, 3, 224, 224), names_filter="hook_pooled")[1]["hook_pooled"].shape[-1]
    weight = torch.randn(2, width, generator=torch.Generator().manual_seed(0))
    path = save_classifier(tmp_path / "ab.pt", "linear", weight, torch.zeros(2), class_names=["a", "b"])
    result = reassess_models([model], labelled16, ReassessSettings(probes=False, progress=False),
                             classifiers=[str(path)])
    cell = result.cell("ttr_behaviour", "planted_vit")
    assert cell.text.endswith("(accuracy)") and cell.why == "accuracy"
    assert 0 <= cell.values["without"] <= 1 and 0 <= cell.values["with"] <= 1
    args = ["reassess", "planted_vit", "--images", str(labelled16), "--no-probes", "--no-progress"]
    assert main(args + ["--classifier", str(tmp_path / "missing.pt")]) == 2
    assert "argument --classifier" in capsys.readouterr().err


def test_redundancy_is_na_when_even_normal_patches_are_parallel():
    """A component shared by every patch (cos >= 0.99 between normal neighbours) leaves nothing to contrast: the
    cell says n/a and why, its medians kept in the values; below that the medians are the cell."""
    from types import SimpleNamespace

    from interp.report.reassessment_cells import PARALLEL_COS, _redundancy_cell

    flat = _redundancy_cell(SimpleNamespace(row={"redund_normal": 0.999, "redund_high": 1.0}, notes={}))
    assert flat.text == "n/a" and "nearly parallel" in flat.why and flat.values["normal"] == 0.999
    fine = _redundancy_cell(SimpleNamespace(row={"redund_normal": PARALLEL_COS - 0.3, "redund_high": 0.99}, notes={}))
    assert fine.text == "0.69 / 0.99" and fine.why is None


def test_the_methods_page_holds_the_rows_as_declared():
    """docs/methods.md section 6's table is ``row_table()`` (regenerate it from ROWS when a row changes)."""
    from pathlib import Path

    from interp.report.reassessment_cells import row_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "methods.md").read_text()
    assert row_table() in page
