"""One Jupyter kernel for the notebook tests: ``examples/notebook.ipynb`` top to bottom, then the explorer's
cells (``interp.explore.start`` shown inline), in one fresh kernel. A kernel start imports torch and timm again
(about 9 s on 2 cores), so the two tests share it, and it runs as an early launch (tests/early.py): a child
process (``python notebook_helpers.py WORKDIR``) executes the notebook and writes ``executed.ipynb`` while the
session runs other tests; each test reads its own cells.

The kernel is ipykernel's own ``python3`` spec (installed in the environment's share/jupyter/kernels by
``pip install ipykernel``); jupyter_client runs it with this interpreter, so no kernel installation step.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

import early

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "notebook.ipynb"
EXPLORER_CELLS = [
    f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
    "import interp, torch\n"
    "from interp.detection.spec import DetectionSpec\n"
    "m = interp.load('vit_small_patch16_224', pretrained=False, depth=1)\n"
    "ex = interp.explore.start(m, torch.randn(2, 3, 224, 224), detection=DetectionSpec(threshold='p99'))\n"
    "ex",
    "import urllib.request\nprint('status', urllib.request.urlopen(ex.url, timeout=30).status)",
]
NEEDS = "pip install -e '.[test]' (nbformat, nbclient, ipykernel)"
PACKAGES = ("nbformat", "nbclient", "ipykernel")
EXECUTED = "executed.ipynb"  # in the launch's workdir


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


@early.launcher("notebook")
def launch(workdir: Path) -> Optional[early.Launch]:
    """The child that executes the notebook in ``workdir``, with one torch thread in the kernel."""
    if any(importlib.util.find_spec(name) is None for name in PACKAGES):
        return None  # the test skips, naming what to install
    return early.Launch([sys.executable, __file__, str(workdir)], env={"OMP_NUM_THREADS": "1"})


def executed() -> ExecutedNotebook:
    """The notebook the launch executed (waiting for it); skips, naming what to install, when a package is
    missing (the launch then had nothing to run)."""
    for name in PACKAGES:
        pytest.importorskip(name, reason=NEEDS)
    import nbformat

    finished = early.result("notebook")
    assert finished.returncode == 0, finished.stderr[-4000:]  # a CellExecutionError names the cell
    nb = nbformat.read(str(finished.workdir / EXECUTED), as_version=4)
    return ExecutedNotebook(nb.cells, nb.metadata["n_example"])


def execute(workdir: Path) -> None:
    """Run the example notebook, then the explorer's cells, in one kernel; write the result to ``workdir``."""
    import nbclient
    import nbformat

    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), \
        "commit the notebook without outputs (Kernel > Restart & Clear Output)"
    nb.metadata["n_example"] = len(nb.cells)
    if importlib.util.find_spec("starlette") is not None:  # the explore extra
        nb.cells += [nbformat.v4.new_code_cell(code) for code in EXPLORER_CELLS]
    client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",  # per cell: a safety net only
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError naming the cell on any exception; shuts the kernel down
    nbformat.write(nb, str(workdir / EXECUTED))


if __name__ == "__main__":
    execute(Path(sys.argv[1]))
