"""CLI policies that hold for every command: which hooks a study needs (checked before any work, written by
``interp cache --for``), unreadable images (skip, record, warn once; ``--strict`` stops), existing outputs
(refused unless ``--overwrite``), output (``--quiet``, ``--no-progress``, one-line warnings), and a parser
that loads without torch."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from interp.detection.spec import DetectionSpec

import interp
from interp.cli import main
from interp.studies.catalog import declared, hooks_for_studies, required_hooks
from interp.console import NO_PROGRESS_ENV, format_warning, progress_wanted
from interp.errors import ImageError, InterpError
from interp.models import sample_image_paths



@pytest.fixture(scope="module")
def photos_with_broken(tmp_path_factory) -> Path:
    """Two bundled photos plus ``broken.jpg`` (text bytes with a .jpg name)."""
    folder = tmp_path_factory.mktemp("photos_broken")
    for path in sample_image_paths():
        if path.stem in ("astronaut", "rocket"):
            shutil.copy(path, folder / path.name)
    (folder / "broken.jpg").write_bytes(b"this is not a JPEG file at all")
    return folder


# ------------------------------------------------------------------------------------------------ parser
def test_building_the_parser_imports_no_torch():
    code = ("import sys, interp.cli; interp.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'timm', 'nnsight', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_declared_study_has_a_parser():
    parser = interp.cli.build_parser()
    study_parsers = next(a for a in parser._subparsers._group_actions[0].choices["study"]._actions
                         if a.dest == "study").choices
    assert set(declared()) == set(study_parsers)
    photos = str(sample_image_paths()[0].parent)
    args = parser.parse_args(["study", "norms", "m", "--images", photos, "--out", "o"])
    assert args.study == "norms" and callable(args.func)


# ------------------------------------------------------------------------------------------ hooks per study
def test_required_hooks_follow_the_options():
    assert required_hooks("norms", 2) == ["blocks.0.hook_resid_mid", "blocks.0.hook_resid_post",
                                          "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"]
    assert required_hooks("neurons", 4, {"detection": DetectionSpec(detect_layer=-2), "highest_layer": 1}) == [
        "blocks.2.hook_resid_post", "blocks.0.mlp.hook_post", "blocks.1.mlp.hook_post"]
    dinov2 = required_hooks("neurons", 24, {"detection": DetectionSpec(preset="jiang-dinov2-l14")})  # detect -2, highest 17
    assert dinov2[0] == "blocks.22.hook_resid_post" and dinov2[1:] == [f"blocks.{i}.mlp.hook_post" for i in range(18)]
    assert required_hooks("neurons", 24, {"detection": DetectionSpec(preset="jiang-dinov2-l14", detect_layer=-1)})[0] == \
        "blocks.23.hook_resid_post"  # an explicit option wins over the preset
    assert required_hooks("neurons", 12, {"detection": DetectionSpec(preset="jiang-dinov2-l14")})[-1] == "blocks.11.mlp.hook_post"  # capped
    assert required_hooks("patch-score", 4, {"reference": "pooled"}) == ["hook_norm_final", "hook_pooled"]
    with pytest.raises(InterpError, match="re-runs the model"):
        required_hooks("ablate", 4)
    with pytest.raises(InterpError, match="out of range"):
        required_hooks("neurons", 4, {"detection": DetectionSpec(detect_layer=7)})
    union = hooks_for_studies(["norms", "neurons"], 2)
    assert union == ["blocks.0.hook_resid_mid", "blocks.0.hook_resid_post", "blocks.1.hook_resid_mid",
                     "blocks.1.hook_resid_post", "blocks.0.mlp.hook_post", "blocks.1.mlp.hook_post"]


def test_cache_for_studies_writes_exactly_their_hooks_and_serves_them(tmp_path, photos_with_broken):
    cache_file = tmp_path / "acts.h5"
    assert main(["cache", "planted_vit", "--images", str(photos_with_broken), "--for", "norms,neurons",
                 "--out", str(cache_file), "--no-progress"]) == 0
    with interp.cache.open(cache_file) as reader:
        assert set(reader.hooks) == set(hooks_for_studies(["norms", "neurons"], interp.load("planted_vit").n_layers))
        assert [path for _, path, _ in reader.skipped] == [str(photos_with_broken / "broken.jpg")]
    out = tmp_path / "out"
    for study in ("norms", "neurons"):
        assert main(["study", study, "planted_vit", "--cache", str(cache_file), "--out", str(out)]) == 0
        data = json.loads((out / f"{study}.json").read_text())
        assert [s["image"] for s in data["skipped"]] == [str(photos_with_broken / "broken.jpg")]


def test_a_cache_that_cannot_serve_the_study_fails_before_any_work(tmp_path, photos_with_broken, capsys,
                                                                    monkeypatch):
    import interp.studies.artifacts.norms  # noqa: F401  (binds the real function first)
    from interp.studies import declaration
    from interp.studies.artifacts.configs import NormsConfig

    def must_not_run(*args, **kwargs):
        raise AssertionError("the study ran although the cache lacks its hooks")

    monkeypatch.setitem(declaration._FUNCTIONS, NormsConfig, must_not_run)  # the function the runner calls
    cache_file = tmp_path / "acts.h5"  # the README's cache: resid_post and mlp_post, no resid_mid
    interp.cache.write(interp.load("planted_vit"), photos_with_broken, path=cache_file, progress=False,
                       hooks=["blocks.*.hook_resid_post", "blocks.*.mlp.hook_post"])
    assert main(["study", "norms", "planted_vit", "--cache", str(cache_file), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "blocks.0.hook_resid_mid" in err and "--for norms" in err
    assert not (tmp_path / "o" / "norms.json").exists()


# ------------------------------------------------------------------------------------------ unreadable images
def test_load_images_skips_and_records_or_stops_when_strict(photos_with_broken):
    model = interp.load("planted_vit")
    skipped = []
    with pytest.warns(UserWarning, match="broken.jpg"):
        x = interp.load_images(photos_with_broken, model, skipped=skipped)
    assert x.shape[0] == 2 and [Path(p).name for p, _ in skipped] == ["broken.jpg"]
    with pytest.raises(ImageError, match="broken.jpg"):
        interp.load_images(photos_with_broken, model, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # readable files: no warning
        assert interp.load_images(sample_image_paths()[:1], model).shape[0] == 1


def test_study_skips_records_and_warns_once_strict_stops(tmp_path, photos_with_broken, capsys, shown_warnings):
    run = ["study", "norms", "planted_vit", "--images", str(photos_with_broken)]
    assert main([*run, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    warning_lines = [line for line in err.splitlines() if "broken.jpg" in line]
    assert len(warning_lines) == 1 and warning_lines[0].startswith("interp: warning: ")
    assert "warnings.warn" not in err and ".py:" not in err
    data = json.loads((tmp_path / "a" / "norms.json").read_text())
    assert [Path(s["image"]).name for s in data["skipped"]] == ["broken.jpg"] and "cannot read" in data["skipped"][0]["reason"]

    assert main([*run, "--out", str(tmp_path / "b"), "--strict"]) == 1
    err = capsys.readouterr().err
    assert "broken.jpg" in err and "interp: error:" in err
    assert not (tmp_path / "b" / "norms.json").exists()


def test_live_source_leaves_unreadable_images_out_of_its_ids(photos_with_broken):
    from interp.studies import open_source

    with pytest.warns(UserWarning):
        source = open_source(model=interp.load("planted_vit"), images=photos_with_broken)
    assert [Path(i).name for i in source.ids] == ["astronaut.jpg", "rocket.jpg"]
    assert [Path(p).name for p, _ in source.skipped] == ["broken.jpg"]
    assert [Path(p).name for p, _ in source.held().skipped] == ["broken.jpg"]


def test_report_skips_records_and_refuses_or_replaces_existing_outputs(tmp_path, photos_with_broken, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):  # a folder the report did not write is never touched
        assert main(["report", "--images", str(photos_with_broken), "--out", str(foreign), *extra]) == 1
    assert (foreign / "notes.txt").read_text() == "mine"

    out = tmp_path / "report"
    out.mkdir()  # as a report left it: its marker lists its files; one of them is stale
    (out / "report.json").write_text(json.dumps({"files": {"index": "index.html", "results": ["norms.json"],
                                                           "figures": ["stale_figure.png"]}}))
    for name in ("index.html", "norms.json", "stale_figure.png"):
        (out / name).write_text("old")
    (out / "notes.txt").write_text("mine")
    assert main(["report", "--images", str(photos_with_broken), "--out", str(out)]) == 1  # no --overwrite
    assert (out / "stale_figure.png").exists()
    capsys.readouterr()
    assert main(["report", "--images", str(photos_with_broken), "--out", str(out), "--overwrite"]) == 0
    err = capsys.readouterr().err  # not a terminal: the stage lines, but no progress bar
    assert "interp report [1/8] High-norm tokens (norms)" in err and "batch/s" not in err and "it/s" not in err
    assert not (out / "stale_figure.png").exists() and (out / "notes.txt").read_text() == "mine"
    summary = json.loads((out / "report.json").read_text())
    assert [Path(s["image"]).name for s in summary["skipped_images"]] == ["broken.jpg"] and summary["n_images"] == 2
    assert (out / "norms.json").read_text() != "old"


# ------------------------------------------------------------------------------------------ existing outputs
def test_study_refuses_to_replace_its_json_unless_overwrite(tmp_path, capsys):
    args = ["study", "norms", "planted_vit", "--images", str(sample_image_paths()[0]), "--out", str(tmp_path)]
    assert main(args) == 0
    written = json.loads((tmp_path / "norms.json").read_text())["figure_files"]
    assert written and all((tmp_path / name).exists() for name in written)
    stale = tmp_path / "stale.png"
    stale.write_text("x")
    data = json.loads((tmp_path / "norms.json").read_text())
    (tmp_path / "norms.json").write_text(json.dumps({**data, "figure_files": [*written, "stale.png"]}))
    capsys.readouterr()
    assert main(args) == 1 and "--overwrite" in capsys.readouterr().err
    assert stale.exists()
    kept = (tmp_path / "norms.json").read_text()
    assert main([*args, "--overwrite", "--detect-layer", "99"]) == 2  # fails: the old result stays whole
    assert (tmp_path / "norms.json").read_text() == kept and stale.exists()
    assert main([*args, "--overwrite"]) == 0
    assert not stale.exists() and all((tmp_path / name).exists() for name in written)


def test_patch_export_and_compare_refuse_existing_files(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"kind": "NeuronAblation", "neurons": {"1": [3]}, "mode": "zero"}]))
    out = tmp_path / "p.safetensors"
    export = ["patch", "export", "vit_small_patch16_224", "--no-pretrained", "--depth", "2",
              "--interventions", str(spec), "--out", str(out)]
    assert main(export) == 0
    first = out.read_bytes()
    out.write_bytes(b"keep me")
    assert main(export) == 1 and "already exists" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"
    assert main([*export, "--overwrite"]) == 0 and out.read_bytes() == first

    (tmp_path / "compare.json").write_text("{}")
    assert main(["compare", "planted_vit", "--out", str(tmp_path)]) == 1
    assert "already exists" in capsys.readouterr().err and (tmp_path / "compare.json").read_text() == "{}"


def test_compare_skips_records_or_stops_when_strict(tmp_path, photos_with_broken, capsys):
    run = ["compare", "planted_vit", "--images", str(photos_with_broken), "--no-probes"]
    assert main([*run, "--out", str(tmp_path / "a")]) == 0
    data = json.loads((tmp_path / "a" / "compare.json").read_text())
    assert [Path(s["image"]).name for s in data["skipped"]] == ["broken.jpg"]
    assert main([*run, "--strict", "--out", str(tmp_path / "b")]) == 1
    assert "broken.jpg" in capsys.readouterr().err and not (tmp_path / "b" / "compare.json").exists()


# ------------------------------------------------------------------------------------------ output
class _Stream:
    def __init__(self, tty: bool):
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_only_on_a_terminal_and_never_when_asked_not_to(monkeypatch):
    monkeypatch.delenv(NO_PROGRESS_ENV, raising=False)
    assert progress_wanted(True, False, _Stream(True))
    assert not progress_wanted(True, False, _Stream(False))  # piped / redirected
    assert not progress_wanted(False, False, _Stream(True))  # --no-progress
    assert not progress_wanted(True, True, _Stream(True))  # --quiet
    monkeypatch.setenv(NO_PROGRESS_ENV, "1")
    assert not progress_wanted(True, False, _Stream(True))
    monkeypatch.setenv(NO_PROGRESS_ENV, "0")
    assert progress_wanted(True, False, _Stream(True))


def test_warning_is_one_clean_line():
    line = format_warning(UserWarning("skipped x.jpg:\n  cannot read"), UserWarning, "/a/b.py", 12, "src")
    assert line == "interp: warning: skipped x.jpg: cannot read\n"


def test_quiet_prints_no_info_lines(tmp_path, capsys):
    image = str(sample_image_paths()[0])
    assert main(["study", "norms", "planted_vit", "--images", image, "--out", str(tmp_path / "a")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["study", "norms", "planted_vit", "--images", image, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and (tmp_path / "b" / "norms.json").exists()
    photos = str(sample_image_paths()[0].parent)
    for command in (["cache", "m", "--images", photos, "--hooks", "h", "--out", "o.h5"], ["report"], ["compare", "m"],
                    ["study", "masking", "m", "--images", photos, "--out", "o"]):
        args = interp.cli.build_parser().parse_args([*command, "--quiet", "--no-progress"])
        assert args.quiet and args.progress is False
