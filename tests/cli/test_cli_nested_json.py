"""Every command that reads a JSON file refuses one nested 100000 deep in one line (issue 35: a deeply nested
sae.json raised a raw RecursionError traceback): intervention specs, neuron lists, box and mask files, probe
splits, an SAE's description."""
from __future__ import annotations

import pytest

from conftest import one_error_line
from interp.cli import main
from interp.models import sample_image_paths

IMAGE = str(sample_image_paths()[0])
DEEP = "[" * 100000


def _file(tmp_path, name):
    path = tmp_path / name
    path.write_text(DEEP)
    return str(path)


def _sae(tmp_path):
    folder = tmp_path / "sae"
    folder.mkdir()
    (folder / "sae.json").write_text(DEEP)
    (folder / "sae.safetensors").write_bytes(b"")
    return str(folder)


STUDY = ["planted_vit", "--images", IMAGE, "--no-progress"]
READERS = {
    "patch export --interventions": lambda t: ["patch", "export", "planted_vit", "--interventions",
                                               _file(t, "spec.json"), "--out", str(t / "p.safetensors")],
    "study ablate --neurons": lambda t: ["study", "ablate", *STUDY, "--neurons", _file(t, "neurons.json"),
                                         "--out", str(t / "o")],
    "study lost --boxes": lambda t: ["study", "lost", *STUDY, "--boxes", _file(t, "boxes.json"), "--out", str(t / "o")],
    "study segment --masks": lambda t: ["study", "segment", *STUDY, "--masks", _file(t, "masks.json"),
                                        "--out", str(t / "o")],
    "study probes --split": lambda t: ["study", "probes", *STUDY, "--split", _file(t, "split.json"),
                                       "--out", str(t / "o")],
    "study sae-features --sae": lambda t: ["study", "sae-features", *STUDY, "--sae", _sae(t), "--out", str(t / "o")],
    "report --sae": lambda t: ["report", "--sae", _sae(t), "--out", str(t / "r"), "--no-progress"],
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_deeply_nested_json_file_is_one_line(tmp_path, capsys, reader):
    assert main(READERS[reader](tmp_path)) in (1, 2)
    line = one_error_line(capsys.readouterr().err)
    assert "nested too deeply" in line or "RecursionError" in line or "not valid JSON" in line or \
        "not a readable" in line, line
