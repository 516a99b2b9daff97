"""The plots registry is one explicit table: importing it is enough, and no figure module imports it back."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import interp

PLOTS = Path(interp.__file__).resolve().parent / "plots"


def test_the_table_is_complete_on_import_alone():
    code = "import json, interp.plots.registry as r; print(json.dumps({k: [s.stem for s in v] for k, v in r.FIGURES.items()}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    table = json.loads(out)
    assert table["norms"] == ["norm_profile", "norm_histograms", "outlier_maps"]
    assert {"neurons", "ablate", "relocate", "registers", "patch_score", "pib", "masking", "selective_cls", "probes",
            "lost", "segmentation"} <= set(table)


def test_no_figure_module_imports_the_registry():
    importers = []
    for path in PLOTS.glob("*.py"):
        if path.name in ("registry.py", "artifacts.py", "__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("registry") and node.level:
                importers.append(path.name)
    assert importers == []
