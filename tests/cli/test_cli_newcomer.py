"""What a new user meets (issue 35): defaults shown in --help, skip reasons printed by pytest, the docs' install
line installing the clone."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from interp.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _parser(*path):
    p = build_parser()
    for name in path:
        p = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)][0].choices[name]
    return p


@pytest.mark.parametrize("command", [("sae", "train")])
def test_every_option_with_a_default_shows_it_in_help(command):
    quiet = [a.option_strings[0] for a in _parser(*command)._actions
             if a.default not in (None, False, True, argparse.SUPPRESS) and a.help and "default" not in a.help]
    assert not quiet, f"options whose --help hides their default: {quiet}"


def test_pytest_prints_skip_reasons_and_the_readme_names_the_browser():
    assert "-rs" in (ROOT / "pyproject.toml").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "chromium" in readme and "chromedriver" in readme


def test_the_docs_install_extras_from_the_clone():
    for page in (ROOT / "docs").glob("*.md"):
        assert "pip install 'interp[" not in page.read_text(), page.name
    assert "[Sparse autoencoders](docs/sae.md)" in (ROOT / "README.md").read_text()
    assert "[Sparse autoencoders](sae.md)" in (ROOT / "docs" / "index.md").read_text()
