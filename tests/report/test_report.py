"""``interp report`` end to end, the ``interp study`` artifact sub-commands, and the artifact figures."""
from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.text import Text

import interp
import interp.cache
from interp.cli import main
from interp.detection.spec import DetectionSpec
from interp.commands.common import parse_neurons
from interp.errors import InterpError
from interp.interventions import masks
from interp.models import planted_truth, sample_image_paths
import interp.plots as plots
from interp.report import run_report
from interp.report.battery import report_sample_paths
from interp.report.summary_table import summary_rows
from interp.studies import open_source
from interp.studies.artifacts.neurons import NeuronsResult, neurons_study
from interp.studies.artifacts.norms import NormsResult, norms_study
from interp.studies.artifacts.relocate import relocation_target

from conftest import images, make_model

STUDY_FILES = ["norms.json", "neurons.json", "ablate.json", "registers.json", "relocate.json"]


def image_sources(index_html: Path):
    """The figure files the page embeds (each ``<img>`` is a base64 PNG; the page links no other file)."""
    page = index_html.read_text(encoding="utf-8")
    sources = re.findall(r'<img\b[^>]*\bsrc="([^"]+)"', page)
    assert all(src.startswith("data:image/png;base64,") for src in sources)  # embedded: one self-contained file
    assert not re.search(r'\b(href|src)="(?!data:|#)', page)                 # no relative link to a sibling file
    return re.findall(r'<img\b[^>]*\bdata-file="([^"]+)"', page)


def embedded_images(index_html: Path) -> dict:
    """data-file name -> the PNG bytes embedded in the page."""
    page = index_html.read_text(encoding="utf-8")
    return {name: base64.b64decode(data) for data, name in
            re.findall(r'<img\b[^>]*\bsrc="data:image/png;base64,([^"]+)"[^>]*\bdata-file="([^"]+)"', page)}


def figure_texts(fig: Figure) -> str:
    """Every text of the figure, whitespace normalised (wrapped lines joined)."""
    return " ".join(" ".join(t.get_text() for t in fig.findobj(Text)).split())


@pytest.mark.slow  # end to end (a whole run or a fresh process); runs once, also in CI
def test_report_on_the_bundled_default_recovers_the_planted_circuit(default_report):
    tmp_path = default_report.out  # one run per session (conftest.py)
    assert default_report.rc == 0
    index = tmp_path / "index.html"
    assert str(index.resolve()) in default_report.stdout and "synthetic" in default_report.stdout
    err = default_report.stderr  # one line per section
    assert "[1/8] High-norm tokens (norms)" in err and "[8/8] Relocation onto a smiley (relocate)" in err

    sources = image_sources(index)
    assert len(sources) == 9  # the causal stages' 3 figures, norms' 3, neurons', redundancy's and the probes'
    assert "probes.png" in sources and "neighbour_similarity.png" in sources
    assert "lost_boxes.png" not in sources and (tmp_path / "lost_boxes.png").is_file()  # random weights
    for name, png in embedded_images(index).items():  # the page holds each figure, the folder a copy
        assert png.startswith(b"\x89PNG") and len(png) > 10_000 and png == (tmp_path / name).read_bytes(), name
    page = index.read_text(encoding="utf-8")
    assert "Synthetic model" in page and "not a trained network" in page

    report = json.loads((tmp_path / "report.json").read_text())
    truth = planted_truth(interp.load("planted_vit"))
    assert report["synthetic"] is True and report["model"] == "planted_vit"
    assert report["n_images"] == len(report_sample_paths()) and report["artifacts_found"] is True
    assert report["emergence"] == {"layer": truth.layer, "component": "mlp"}
    planted = report["planted"]
    assert planted["layer_recovered"] is True and planted["all_neurons_recovered"] is True
    assert planted["neurons_recovered"] == sorted(truth.neurons) and planted["extra_neurons"] == []
    ranked = {(n["layer"], n["neuron"]) for n in report["neurons"]}
    assert ranked == {(truth.layer, n) for n in truth.neurons}
    effects = report["ablation"]["effects"]["outlier_count"]
    assert effects["target"] == 0 < effects["baseline"] and effects["control_mean"] >= 0.9 * effects["baseline"]
    assert report["test_time_register"]["outliers_after"] == 0
    assert report["relocation"]["mean_iou_active"] >= 0.9
    behaviour = report["behaviour"]  # a random head classifies nothing: the pooled cosine, never an accuracy
    assert behaviour["metric"] == "pooled_cosine" and "planted_vit is synthetic" in behaviour["note"]
    assert behaviour["ablation"]["baseline"] == pytest.approx(1.0) and report["test_time_register"]["top1_agreement"] is None
    assert "cosine of the pooled vector to the unedited one" in page
    assert report["probes"]["position"]["high_norm"]["n"] > 0 and report["lost"]["n_images"] == report["n_images"]
    assert "3. Linear probes per token group (probes)" in page and "4. LOST object discovery (lost)" in page
    assert report["probes"]["too_few"] is None and "Not scored" not in page
    redundancy = report["redundancy"]   # the planted high-norm tokens are flat patches: redundant ones
    assert redundancy["high_norm"]["median"] > 0.99 > redundancy["normal"]["median"]
    assert "redundant patches (median cosine to the 4 neighbouring input patches)" in page
    for name in STUDY_FILES:
        assert json.loads((tmp_path / name).read_text())["study"] == name[:-5]


def test_report_without_artifacts_skips_the_causal_studies(tmp_path):
    summary = run_report(make_model("vit"), images=images(2), out_dir=tmp_path, progress=False)
    assert summary["synthetic"] is False and summary["planted"] is None
    assert summary["artifacts_found"] is False and summary["neurons"] == []
    assert summary["ablation"] is None and summary["test_time_register"] is None and summary["relocation"] is None
    assert "no register neurons" in summary["skipped"]
    assert summary["top_k"] == 10 and summary["highest_layer"] == summary["detect_layer"] == 1
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["lost.json", "neurons.json", "norms.json",
                                                                "probes.json", "redundancy.json", "report.json"]
    assert summary["probes"]["position"]["high_norm"]["score"] is None  # no artifacts: an empty group, no number
    assert summary["redundancy"]["high_norm"]["median"] is None and summary["redundancy"]["normal"]["n_tokens"] > 0
    assert "high-norm - (no token in this group)" in (tmp_path / "index.html").read_text(encoding="utf-8")
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "Skipped" in page and "No high-norm tokens found" in page and "Synthetic" not in page
    assert all((tmp_path / src).is_file() for src in image_sources(tmp_path / "index.html"))
    step = summary["largest_step"]  # the profile's largest step is named beside "no emergence", not left unsaid
    assert summary["emergence"] is None and step["jump"] > 0
    assert dict(summary_rows(summary))["emergence"] == (
        f"none: no artifacts, so no step is their emergence; the profile's largest max/median step is "
        f"{step['jump']:.1f}x at block {step['layer']}'s {step['component']} step")


def test_report_escapes_text(tmp_path):
    """Image ids and messages go into the page escaped."""
    from interp.report import write_html

    summary = json.loads(json.dumps({
        "model": "<script>x</script>", "fingerprint": "f", "synthetic": False, "n_images": 1,
        "artifacts_found": False, "threshold": None, "threshold_method": "auto", "detect_layer": 0,
        "outlier_fraction": 0.0, "emergence": None, "neurons": [], "neurons_message": "a & b",
        "highest_layer": 0, "top_k": 10, "skipped": "<b>why</b>", "ablation": None, "test_time_register": None,
        "relocation": None, "planted": None, "seconds": 1.0}))
    (tmp_path / 'a"b.png').write_bytes(b"\x89PNG not really")
    write_html(tmp_path / "index.html", summary, {"norms": ["a\"b.png", "norm_<i>.png"]})
    page = (tmp_path / "index.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>why" not in page
    assert 'data-file="a&quot;b.png"' in page and "a &amp; b" in page
    assert "figure norm_&lt;i&gt;.png was not written" in page  # a missing figure file is said, not linked


# ----------------------------------------------------------------------------------------- interp study
@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory):
    """Two bundled photos that have high-norm tokens in the planted model (flat sky, flat background)."""
    folder = tmp_path_factory.mktemp("photos")
    for path in sample_image_paths():
        if path.stem in ("astronaut", "rocket"):
            shutil.copy(path, folder / path.name)
    return folder


def read_study(out: Path, study: str, figures):
    data = json.loads((out / f"{study}.json").read_text())
    assert data["study"] == study
    for name in figures:
        assert (out / f"{name}.png").stat().st_size > 10_000, name
    return data


def test_study_norms_and_neurons_cli_live_and_cached(tmp_path, photo_dir):
    planted = interp.load("planted_vit")
    cache_file = tmp_path / "acts.h5"
    interp.cache.write(planted, photo_dir, hooks=["blocks.*.hook_resid_mid", "blocks.*.hook_resid_post"],
                       path=cache_file, dtype="float32", progress=False)
    out = tmp_path / "out"
    assert main(["study", "norms", "planted_vit", "--cache", str(cache_file), "--out", str(out),
                 "--threshold", "p90"]) == 0
    norms = read_study(out, "norms", ["norm_profile", "norm_histograms", "outlier_maps"])
    assert norms["threshold_method"] == "percentile" and norms["params"]["threshold"] == "p90"
    assert norms["cls_attention_max"] is None  # the cache holds no attention patterns

    assert main(["study", "neurons", "planted_vit", "--images", str(photo_dir), "--out", str(out),
                 "--top-k", "4", "--highest-layer", "2"]) == 0
    neurons = read_study(out, "neurons", ["neuron_scores"])
    assert {(n["layer"], n["neuron"]) for n in neurons["neurons"]} == {(2, n) for n in planted_truth(planted).neurons}


def test_study_causal_cli_commands(tmp_path, photo_dir):
    out = tmp_path / "out"
    neurons = "2:17,2:101,2:402,2:655"
    common = ["planted_vit", "--images", str(photo_dir), "--out", str(out)]
    assert main(["study", "ablate", *common, "--neurons", neurons, "--controls", "2", "--seed", "3"]) == 0
    ablate = read_study(out, "ablate", ["ablation_bars"])
    assert ablate["summary"]["outlier_count"]["target"] == 0 and len(ablate["controls"]) == 2 and ablate["seed"] == 3

    assert main(["study", "relocate", *common, "--neurons", neurons, "--target", "box:2,3,2,4"]) == 0
    relocate = read_study(out, "relocate", ["relocation_maps"])
    assert sum(map(sum, relocate["target"])) == 8 and relocate["mean_iou"] >= 0.9

    (out / "neurons.json").write_text(NeuronsResult(
        model="planted_vit", fingerprint="-", params={}, seed=0,
        neurons=[{"layer": 2, "neuron": n, "score": 1.0} for n in (17, 101, 402, 655)]).to_json())
    assert main(["study", "registers", *common, "--neurons", str(out / "neurons.json"), "--n-registers", "2"]) == 0
    registers = read_study(out, "registers", ["register_summary"])
    assert registers["n_registers"] == 2 and registers["with_register"]["outlier_count"] == 0


@pytest.mark.parametrize("args, message", [
    (["--neurons", "2:17,x"], "cannot read 'x'"),
    (["--neurons", "2-17"], "LAYER:NEURON"),
    (["--neurons", "2:17,2:17"], "listed twice"),
    ([], "needs --neurons"),
])
def test_study_neurons_argument_errors(tmp_path, capsys, args, message):
    images = tmp_path / "images"  # one readable image: the image pre-check passes, the neurons are refused
    images.mkdir()
    shutil.copy(sample_image_paths()[0], images)
    for study in ("ablate", "relocate", "registers"):
        rc = main(["study", study, "planted_vit", "--images", str(images), "--out", str(tmp_path / "o"), *args])
        assert rc == 1
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_parse_neurons_and_targets():
    assert parse_neurons("2:17, 2:101,5:40") == {2: [17, 101], 5: [40]}
    assert parse_neurons(" 0:3 ") == {0: [3]}
    for bad in ("", "2", "2:", ":3", "a:b", "2:17;3:4", "-1:3"):
        with pytest.raises(InterpError, match="--neurons"):
            parse_neurons(bad)
    smiley = masks.smiley((14, 14))
    assert torch.equal(relocation_target("smiley", (14, 14)), smiley)
    assert torch.equal(relocation_target(None, (14, 14)), smiley)
    assert int(relocation_target("box:0,0,2,3", (14, 14)).sum()) == 6
    assert relocation_target("indices:0,15,195", (14, 14)).nonzero().tolist() == [[0, 0], [1, 1], [13, 13]]
    for bad in ("box:1,2", "box:13,13,3,3", "indices:", "indices:196", "star", "box:a,b,c,d"):
        with pytest.raises(InterpError, match="--target"):
            relocation_target(bad, (14, 14))


# ----------------------------------------------------------------------------------------- figures
def test_figures_say_so_when_there_are_no_high_norm_tokens(tmp_path):
    src = open_source(model=make_model("dinov2_reg"), images=images(2))
    norms, neurons = norms_study(src, progress=False), neurons_study(src, progress=False)
    texts = {name: figure_texts(fig) for name, fig in plots.study_figures(norms) + plots.study_figures(neurons)}
    assert plots.common.NO_ARTIFACTS in texts["outlier_maps"] and plots.common.NO_ARTIFACTS in texts["norm_histograms"]
    assert "no register neurons ranked" in texts["neuron_scores"] and neurons.message in texts["neuron_scores"]
    for _, fig in plots.study_figures(norms):
        fig.savefig(tmp_path / "f.png", dpi=110)


def test_figures_draw_from_saved_results_only(tmp_path):
    """Plots need nothing but the result (here read back from JSON), and overlay images when given."""
    planted = interp.load("planted_vit")
    x = images(2)
    x[:, :, :64, :64] = 0.3
    norms_study(open_source(model=planted, images=x), progress=False).to_json(tmp_path / "norms.json")
    norms = NormsResult.from_json(tmp_path / "norms.json")
    fig = plots.norms.outlier_maps(norms, images=(x * 0.25 + 0.5).clamp(0, 1))
    assert isinstance(fig, Figure) and "16 outlier patches" in figure_texts(fig)
    assert len(fig.axes) == 2 and len(fig.axes[0].images) == 2  # the photo and the outlier overlay
    for name, fig in plots.study_figures(norms):
        fig.savefig(tmp_path / f"{name}.png", dpi=110)
    with pytest.raises(ValueError, match="images given"):
        plots.norms.outlier_maps(norms, images=x[:1].clamp(0, 1))
    with pytest.raises(ValueError, match="no figures for a object"):
        plots.study_figures(object())


def test_report_decodes_each_image_once(tmp_path, monkeypatch):
    """Every stage reads the one held source: the image files are decoded once, whatever the stage count."""
    from PIL import Image

    import interp.runtime.live_source as source_mod

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (80, 60), (30 * i, 100, 200)).save(folder / f"p{i}.png")
    decoded = []
    real = source_mod.load_images
    monkeypatch.setattr(source_mod, "load_images", lambda paths, model, **kw: decoded.extend(paths) or real(paths, model, **kw))
    summary = run_report(make_model("vit"), images=folder, out_dir=tmp_path / "out", progress=False, batch_size=2)
    assert sorted(decoded) == sorted(folder.glob("*.png")) and summary["image_ids"] == [str(p) for p in decoded]
    assert summary["files"]["figures"]  # the map figures drew the held images too


@pytest.mark.slow  # end to end (a whole run or a fresh process); runs once, also in CI
def test_study_neurons_on_a_model_without_artifacts_says_so(tmp_path, photo_dir, capsys, shown_warnings):
    """A random-init ViT has no separated high-norm mode, and its highest-norm tokens are high from the input on:
    under p98 the JSON says artifacts_found false with a warning naming the tokens the blocks did not form (and no
    register neurons are ranked on them), and the CLI prints that warning on one line (``shown_warnings``: as a
    plain interpreter shows it, not recorded by pytest)."""
    out = tmp_path / "out"
    assert main(["study", "neurons", "vit_small_patch16_224", "--no-pretrained", "--depth", "2", "--images",
                 str(photo_dir), "--out", str(out), "--threshold", "p98", "--no-progress"]) == 0
    data = read_study(out, "neurons", [])
    assert data["artifacts_found"] is False and data["threshold_method"] == "percentile"
    assert data["warning"].startswith("no artifacts: ") and "high-norm from the input" in data["warning"]
    assert data["neurons"] == []  # nothing formed by the blocks: no "register neurons" ranked on input tokens
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "no artifacts" in line]
    assert len(lines) == 1 and lines[0].startswith("interp: warning: no artifacts") and "not register" in lines[0]


def test_report_without_artifacts_under_a_percentile_threshold_says_no_artifacts(tmp_path):
    with pytest.warns(UserWarning, match="shows no artifacts"):
        summary = run_report(make_model("vit"), images=images(2), out_dir=tmp_path, progress=False,
                             detection=DetectionSpec(threshold="p98"), n_controls=1)
    assert summary["artifacts_found"] is False and summary["neurons"]  # ranked under p98 ...
    assert "not register neurons" in summary["no_artifacts_note"]  # ... and said plainly what they are not
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "No artifacts." in page and "none: the model shows no artifacts" in page
    for study in ("neurons", "ablate", "registers", "relocate"):
        data = json.loads((tmp_path / f"{study}.json").read_text())
        assert data["artifacts_found"] is False and data["warning"].startswith("no artifacts"), study
