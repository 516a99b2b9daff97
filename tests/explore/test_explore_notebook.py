"""``interp.explore.start(model, images)`` in a real Jupyter kernel: the cell shows the page inline (an IFrame to the
local server, which answers), and the server stops when the kernel shuts down (the cells run after the example
notebook's, in its kernel: tests/notebook_helpers.py)."""
from __future__ import annotations

import re
import urllib.request

import pytest

pytest.importorskip("starlette", reason="the explore extra (pip install -e '.[explore]') is not installed")
pytestmark = pytest.mark.early("notebook")


def test_explore_shows_inline_and_stops_with_the_kernel(executed_notebook):
    shown_cell, status_cell = executed_notebook.explorer
    shown = [o for o in shown_cell.outputs if o.output_type == "execute_result"]
    html = shown[0].data["text/html"]
    url = re.search(r'<iframe src="([^"]+)"', html).group(1)
    assert url.startswith("http://127.0.0.1:") and "?token=" in url
    assert "status 200" in "".join(o.text for o in status_cell.outputs if o.output_type == "stream")
    with pytest.raises(OSError):  # the kernel is gone, and its server with it
        urllib.request.urlopen(url, timeout=5)
