"""``interp.explore.start(model, images)`` in a real Jupyter kernel: the cell shows the page inline (an IFrame to the
local server, which answers), and the server stops when the kernel shuts down."""
from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
pytest.importorskip("ipykernel", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
pytest.importorskip("starlette", reason="the explore extra (pip install -e '.[explore]') is not installed")

ROOT = REPO
CELLS = [
    f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
    "import interp, torch\n"
    "m = interp.load('vit_small_patch16_224', pretrained=False, depth=1)\n"
    "ex = interp.explore.start(m, torch.randn(2, 3, 224, 224), threshold='p99')\n"
    "ex",
    "import urllib.request\nprint('status', urllib.request.urlopen(ex.url, timeout=30).status)",
]


@pytest.mark.slow
def test_explore_shows_inline_and_stops_with_the_kernel(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",  # per cell: a safety net only
                                     resources={"metadata": {"path": str(tmp_path)}})
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        client.execute()  # shuts the kernel down at the end
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    shown = [o for o in nb.cells[0].outputs if o.output_type == "execute_result"]
    html = shown[0].data["text/html"]
    url = re.search(r'<iframe src="([^"]+)"', html).group(1)
    assert url.startswith("http://127.0.0.1:") and "?token=" in url
    assert "status 200" in "".join(o.text for o in nb.cells[1].outputs if o.output_type == "stream")
    with pytest.raises(OSError):  # the kernel is gone, and its server with it
        urllib.request.urlopen(url, timeout=5)
