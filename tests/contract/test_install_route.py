"""The CPU-only torch route is a set-up step of its own, before the install, with the torch versions the
package requires (issue 52, item 11): a newcomer without a GPU who follows the README literally does not take
PyPI's 6 GB CUDA build."""
from __future__ import annotations

import re

from doc_examples import REPO, code_blocks, shell_commands

CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _torch_requirement() -> str:
    """pyproject's torch dependency (``torch>=2.6,<2.15``), read as text (tomllib is Python 3.11+)."""
    return re.search(r'^\s*"(torch[<>=!~][^"]*)"', (REPO / "pyproject.toml").read_text(encoding="utf-8"),
                     flags=re.M).group(1)


def _commands(page) -> list:
    return [c for b in code_blocks(page.read_text(encoding="utf-8")) if b.lang == "bash"
            for c in shell_commands(b.code)]


def test_the_cpu_torch_line_comes_first_with_the_required_versions():
    for page in (REPO / "README.md", REPO / "docs" / "getting-started.md"):
        commands = _commands(page)
        cpu = [i for i, c in enumerate(commands) if CPU_INDEX in c]
        install = [i for i, c in enumerate(commands) if c.startswith("pip install -e .")]
        assert cpu and install and cpu[0] < install[0], f"{page.name}: no CPU-only torch step before the install"
        assert f"pip install '{_torch_requirement()}' {CPU_INDEX}" == commands[cpu[0]], page.name
    assert "pip install -e . && interp report --out report" in _commands(REPO / "README.md")
