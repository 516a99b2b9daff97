"""examples/notebook.ipynb runs top to bottom in a fresh kernel and shows what it claims.

The kernel is ipykernel's own ``python3`` spec (installed in the environment's share/jupyter/kernels by
``pip install ipykernel``); jupyter_client runs it with this interpreter, so no kernel installation step.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
pytest.importorskip("ipykernel", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")

NOTEBOOK = REPO / "examples" / "notebook.ipynb"


def _outputs(nb, output_type):
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
            if o.output_type == output_type]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), \
        "commit the notebook without outputs (Kernel > Restart & Clear Output)"
    workdir = tmp_path_factory.mktemp("notebook")
    client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",  # per cell: a safety net only
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError naming the cell on any exception
    return nb


def test_notebook_runs_without_errors(executed):
    assert _outputs(executed, "error") == []
    assert all(cell.execution_count for cell in executed.cells if cell.cell_type == "code")


def test_notebook_shows_results_and_maps(executed):
    displays = _outputs(executed, "display_data") + _outputs(executed, "execute_result")
    html = [o.data["text/html"] for o in displays if "text/html" in o.data]
    assert any("norms study" in h for h in html) and any("neurons study" in h for h in html)
    assert sum("image/png" in o.data for o in displays) >= 1  # the norm maps


def test_notebook_ablation_removes_outliers_not_random(executed):
    text = "".join(o.text for o in _outputs(executed, "stream") if o.name == "stdout")
    found = dict(re.findall(r"^\s*(.+?): max patch norm\s+[\d.]+, tokens above threshold (\d+)$", text, re.M))
    assert set(found) == {"original", "register neurons off", "random neurons off"}, text
    assert int(found["original"]) > 0
    assert int(found["register neurons off"]) == 0
    assert int(found["random neurons off"]) > 0
