"""Names the ``>>>`` examples in ``interp``'s docstrings run with (``pytest`` collects them: ``--doctest-modules``).

Every docstring example runs in a fresh temporary folder, with these names already defined:

- ``interp``, ``torch``;
- ``model``: ``interp.load("planted_vit")``, the synthetic ViT with planted register neurons in block 2
  (neurons 17, 101, 402, 655; 6 blocks, width 192, MLP width 768, 224 px, 14 x 14 patches);
- ``photos``: the folder of the four bundled sample photos; ``images``: those photos as a Tensor
  [4, 3, 224, 224] (``interp.load_images(photos, model)``);
- ``source``: ``interp.studies.open_source(model=model, images=photos)``;
- in the folder: ``boxes.csv`` (one box per photo, original pixels) and ``masks.json`` (one COCO polygon
  on ``astronaut.jpg``), the files the README's examples write.

The model is built once per session and copied for each example, so no example sees another's edits.
"""
from __future__ import annotations

import ast
import copy
import importlib.util
import sys
from pathlib import Path

import pytest
from _pytest.doctest import DoctestItem

PACKAGE = Path(__file__).resolve().parent / "interp"


def _missing_optional_import(path: Path):
    """The first module-level third-party import of ``path`` that is not installed (an optional extra), or None."""
    for node in ast.parse(path.read_text()).body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        for name in names:
            top = name.split(".")[0]
            if top != "interp" and top not in sys.stdlib_module_names and importlib.util.find_spec(top) is None:
                return top
    return None


def pytest_ignore_collect(collection_path, config):
    """Doctests: a module of ``interp`` that imports an optional package which is not installed is left out
    (it cannot be imported; the tests of that extra say so themselves)."""
    path = Path(collection_path)
    if path.suffix == ".py" and PACKAGE in path.resolve().parents and _missing_optional_import(path):
        return True
    return None

BOXES_CSV = ("image,x0,y0,x1,y1\nastronaut.jpg,60,20,200,160\nchelsea.jpg,140,20,330,220\n"
             "coffee.jpg,60,20,330,240\nrocket.jpg,150,0,240,256\n")
MASKS_JSON = ('{"images": [{"id": 1, "file_name": "astronaut.jpg", "width": 256, "height": 256}], '
              '"annotations": [{"image_id": 1, "segmentation": [[40, 20, 200, 20, 200, 250, 40, 250]]}]}')

_MODEL = []  # the session's planted_vit, built on the first doctest


def _planted():
    if not _MODEL:
        import interp
        _MODEL.append(interp.load("planted_vit"))
    return copy.deepcopy(_MODEL[0])


@pytest.fixture(autouse=True)
def _docstring_example_names(request, tmp_path, monkeypatch):
    """For doctests only: run in a temporary folder and define the names listed in the module docstring."""
    if not isinstance(request.node, DoctestItem):
        yield
        return
    import torch

    import interp
    from interp.models.inputs.samples import SAMPLES_DIR
    from interp.studies import open_source

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INTERP_NO_PROGRESS", "1")
    (tmp_path / "boxes.csv").write_text(BOXES_CSV)
    (tmp_path / "masks.json").write_text(MASKS_JSON)
    model = _planted()
    photos = str(SAMPLES_DIR)
    namespace = request.getfixturevalue("doctest_namespace")
    namespace.update(interp=interp, torch=torch, model=model, photos=photos,
                     images=interp.load_images(photos, model), source=open_source(model=model, images=photos))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
