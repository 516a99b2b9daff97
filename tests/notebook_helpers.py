"""One Jupyter kernel for the notebook tests: ``examples/notebook.ipynb`` top to bottom, then the explorer's
cells (``interp.explore.start`` shown inline), in one fresh kernel. A kernel start imports torch and timm again
(about 9 s on 2 cores), so the two tests share it; each reads its own cells.

The kernel is ipykernel's own ``python3`` spec (installed in the environment's share/jupyter/kernels by
``pip install ipykernel``); jupyter_client runs it with this interpreter, so no kernel installation step.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "notebook.ipynb"
EXPLORER_CELLS = [
    f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
    "import interp, torch\n"
    "m = interp.load('vit_small_patch16_224', pretrained=False, depth=1)\n"
    "ex = interp.explore.start(m, torch.randn(2, 3, 224, 224), threshold='p99')\n"
    "ex",
    "import urllib.request\nprint('status', urllib.request.urlopen(ex.url, timeout=30).status)",
]
NEEDS = "pip install -e '.[test]' (nbformat, nbclient, ipykernel)"


@dataclass
class ExecutedNotebook:
    """The executed notebook (kernel shut down): the example's cells, then the explorer's (when the explore
    extra is installed)."""

    cells: list
    n_example: int

    @property
    def example(self) -> list:
        return self.cells[:self.n_example]

    @property
    def explorer(self) -> list:
        return self.cells[self.n_example:]


def execute(workdir: Path) -> ExecutedNotebook:
    """Run the example notebook, then the explorer's cells, in one kernel with one torch thread."""
    nbformat = pytest.importorskip("nbformat", reason=NEEDS)
    nbclient = pytest.importorskip("nbclient", reason=NEEDS)
    pytest.importorskip("ipykernel", reason=NEEDS)
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), \
        "commit the notebook without outputs (Kernel > Restart & Clear Output)"
    n_example = len(nb.cells)
    if importlib.util.find_spec("starlette") is not None:  # the explore extra
        nb.cells += [nbformat.v4.new_code_cell(code) for code in EXPLORER_CELLS]
    client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",  # per cell: a safety net only
                                     resources={"metadata": {"path": str(workdir)}})
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the kernel inherits it
    try:
        client.execute()  # raises CellExecutionError naming the cell on any exception; shuts the kernel down
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = before
    return ExecutedNotebook(nb.cells, n_example)
