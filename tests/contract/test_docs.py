"""The project's documentation: it cites only files the project has, and its docstring examples run.

``docs/methods.md`` is the project's account of the methods; code and docs point to it as
``docs/methods.md section N`` (or ``sections N-M`` / ``sections N and M``), and each such section must exist.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from conftest import REPO

ROOT = REPO
TEXT_SUFFIXES = {".py", ".md", ".toml", ".cfg", ".txt", ".ipynb", ".yaml", ".yml", ".sh", ".html", ""}
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "build", "dist", ".eggs", "node_modules"}
# Notes outside the project that code once cited; spelled in two pieces so this file does not cite them itself.
FOREIGN_NOTES = ("SCIENCE" + ".md", "ARCHITECTURE" + ".md")


def project_text_files():
    """(path relative to the root, text) of every text file of the checkout; skipped folders are never entered
    (a virtual environment inside the checkout holds more files than the project)."""
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(names):
            path = Path(folder) / name
            if path.suffix in TEXT_SUFFIXES and (path.suffix or path.parent.name == ".ci") and path.is_file():
                try:
                    yield path.relative_to(ROOT), path.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    continue


def test_no_file_cites_notes_the_project_does_not_have():
    hits = [f"{rel}:{i}: {line.strip()}" for rel, text in project_text_files()
            for i, line in enumerate(text.splitlines(), 1) if any(n in line for n in FOREIGN_NOTES)]
    assert hits == [], "cite docs/methods.md or docs/architecture.md instead:\n" + "\n".join(hits)


def test_every_cited_docs_file_exists():
    cited = {(str(rel), m) for rel, text in project_text_files()
             for m in re.findall(r"\bdocs/([\w.-]+\.md)\b", text)}
    missing = sorted(f"{rel} cites docs/{name}" for rel, name in cited if not (ROOT / "docs" / name).is_file())
    assert missing == [], "\n".join(missing)


def methods_sections():
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    return {int(n) for n in re.findall(r"^## (\d+)\. ", text, flags=re.M)}


def test_every_cited_methods_section_exists():
    sections = methods_sections()
    assert sections >= {1, 2, 3, 4, 5, 6}
    bad = []
    for rel, text in project_text_files():
        for m in re.finditer(r"docs/methods\.md,? sections? (\d+)(?:-(\d+)| and (\d+))?", text):
            first, last, other = (int(g) if g else None for g in m.groups())
            wanted = set(range(first, (last or first) + 1)) | ({other} if other else set())
            if not wanted <= sections:
                bad.append(f"{rel}: {m.group(0)!r} (methods.md has sections {sorted(sections)})")
    assert bad == [], "\n".join(bad)


def test_the_test_command_runs_the_docstring_examples():
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "interp" in options["testpaths"] and "--doctest-modules" in options["addopts"].split()
