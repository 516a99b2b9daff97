"""examples/notebook.ipynb runs top to bottom in a fresh kernel and shows what it claims (the kernel is shared
with the explorer's notebook test: tests/notebook_helpers.py)."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.early("notebook")


def _outputs(cells, output_type):
    return [o for cell in cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == output_type]


@pytest.fixture(scope="module")
def executed(executed_notebook):
    return executed_notebook.example


def test_notebook_runs_without_errors(executed):
    assert _outputs(executed, "error") == []
    assert all(cell.execution_count for cell in executed if cell.cell_type == "code")


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
