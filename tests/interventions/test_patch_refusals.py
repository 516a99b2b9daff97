"""Crafted patch files and intervention specs are refused with one clear error line."""
from __future__ import annotations

import json

import pytest
import torch

from interp.errors import InterpError

from conftest import make_model, one_error_line


# ------------------------------------------------------------------------------------------ patch files and specs
def _crafted_patch(tmp_path, edit_spec=None, drop_tensors=False, name="crafted.safetensors"):
    """A valid patch of a NeuronAblation(mean) + TestTimeRegister, its spec changed by ``edit_spec(spec)``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from interp.interventions import NeuronAblation, TestTimeRegister
    from interp.interventions import export

    model = make_model("vit")
    means = {0: torch.tensor([0.5, 0.25])}
    path = export.save([NeuronAblation({0: [1, 2]}, mode="mean", means=means), TestTimeRegister({1: [3]})],
                       tmp_path / "ok.safetensors", model)
    with safe_open(str(path), framework="pt") as f:
        spec = json.loads(f.metadata()[export.METADATA_KEY])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if drop_tensors:
        tensors = {}
        spec["tensor_sha256"] = export._tensor_digest(tensors)
    if edit_spec is not None:
        spec = edit_spec(spec) or spec
    text = spec if isinstance(spec, str) else json.dumps(spec)
    out = tmp_path / name
    save_file(tensors, str(out), metadata={export.METADATA_KEY: text})
    return out


def _set(key, value):
    def edit(spec):
        spec[key] = value
    return edit


def _set_param(index, key, value):
    def edit(spec):
        spec["interventions"][index]["params"][key] = value
    return edit


PATCH_CASES = {
    "deeply nested JSON": (lambda spec: "[" * 100000 + "]" * 100000, "nested too deeply"),
    "interventions int": (_set("interventions", 3), "is a int, not a list"),
    "interventions null": (_set("interventions", None), "is a NoneType, not a list"),
    "interventions strings": (_set("interventions", ["a", "b"]), "entry 0 .* is not an object"),
    "version abc": (_set("version", "abc"), "version is 'abc', not a whole number"),
    "version null": (_set("version", None), "version is None, not a whole number"),
    "n_registers 50000": (_set_param(1, "n_registers", 50000), "n_registers=50000 is more than 1024"),
    "n_registers 1e7": (_set_param(1, "n_registers", 10**7), "n_registers=10000000 is more than 1024"),
    "n_registers text": (_set_param(1, "n_registers", "many"), "whole number"),
    "neurons list": (_set_param(1, "neurons", [1, 2]), "invalid TestTimeRegister entry 1"),
}


@pytest.mark.parametrize("case", list(PATCH_CASES))
def test_crafted_patch_specs_are_one_patch_error(tmp_path, case):
    from interp.errors import PatchError
    from interp.interventions import export

    edit, message = PATCH_CASES[case]
    path = _crafted_patch(tmp_path, edit)
    with pytest.raises(PatchError, match=message) as info:
        export.load(path)
    assert "\n" not in str(info.value)


def test_patch_missing_a_tensor_is_named(tmp_path):
    from interp.errors import PatchError
    from interp.interventions import export

    with pytest.raises(PatchError, match=r"entry 0 \(NeuronAblation\) needs tensor\(s\) \['0.means.0'\]"):
        export.load(_crafted_patch(tmp_path, drop_tensors=True))


@pytest.mark.parametrize("content,message", [
    ("[" * 100000 + "]" * 100000, "nested too deeply"), (b"\xff\xfe\x00bad", "UnicodeDecodeError"),
    ('[{"kind": ["x"]}]', "unknown intervention kind"), ('[{"kind": "TestTimeRegister", "neurons": {"0": [1]}, '
                                                          '"n_registers": 20000}]', "more than 1024"),
    ("3", "list of objects")])
def test_crafted_intervention_spec_files(tmp_path, content, message):
    from interp.interventions import interventions_from_spec

    path = tmp_path / "spec.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InterpError, match=message):
        interventions_from_spec(path)


def test_cli_crafted_patch_is_one_line_without_traceback(tmp_path, capsys):
    from interp.cli import main

    path = _crafted_patch(tmp_path, _set("interventions", None))
    assert main(["patch", "show", str(path)]) != 0  # a traceback would raise here
    assert "not a list" in one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------ patch show, torch-free
def test_patch_show_reads_the_file_without_torch(tmp_path):
    """`interp patch show FILE` needs no model: it answers without importing torch (issue 52, item 8), and says
    what the torch reader says: the same kinds, the same checksum, the same refusals."""
    import subprocess
    import sys

    from interp.formats.patch_spec import KNOWN_KINDS
    from interp.interventions import Intervention

    assert sorted(KNOWN_KINDS) == sorted(Intervention.registry)
    path = _crafted_patch(tmp_path)
    code = ("import sys; from interp.cli import main; code = main(['patch', 'show', sys.argv[1]]); "
            "print('torch' in sys.modules, 'timm' in sys.modules, code)")
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert run.stdout.splitlines()[-1] == "False False 0", run.stderr
    assert "[0] NeuronAblation" in run.stdout and "means.0: [2] float32" in run.stdout


@pytest.mark.parametrize("damage", ["truncated", "checksum", "unknown kind"])
def test_patch_show_refuses_a_damaged_file_in_one_line(tmp_path, capsys, damage):
    from interp.cli import main

    if damage == "unknown kind":
        path = _crafted_patch(tmp_path, lambda spec: spec["interventions"][0].update(kind="Exotic"))
    else:
        path = _crafted_patch(tmp_path)
        data = bytearray(path.read_bytes())
        path.write_bytes(bytes(data[:-3]) if damage == "truncated" else bytes(data[:-1] + bytes([data[-1] ^ 1])))
    assert main(["patch", "show", str(path)]) == 1
    err = one_error_line(capsys.readouterr().err)
    assert {"truncated": "truncated", "checksum": "checksum", "unknown kind": "unknown intervention kind"}[damage] in err
