"""docs/architecture.md says what the code is: its layer line is the order tests/contract/test_imports.py
enforces, every file and folder it names exists, and its row for ``interp/models/`` names every module there by
job (the families and the planted models are described in their own section and row)."""
from __future__ import annotations

import re

from conftest import REPO
from test_imports import LAYERS

PAGE = REPO / "docs" / "architecture.md"


def _short(name: str) -> str:
    return name.rpartition(".")[2] if name != "interp" else name


def test_the_layer_line_is_the_enforced_order():
    text = PAGE.read_text(encoding="utf-8")
    line = text.split("<!-- layers -->\n", 1)[1].splitlines()[0].strip()
    written = [[n.strip() for n in group.split(",")] for group in line.split("<")]
    # the enforced layers, less the private helpers of the first layer and the package root at the top
    enforced = [[_short(n) for n in layer if not _short(n).startswith("_") and n not in ("interp.errors", "interp.values", "interp.paths",
                                                                                          "interp.console", "interp.__main__", "interp")]
                for layer in LAYERS]
    enforced = [layer for layer in enforced if layer]
    assert [sorted(g) for g in written] == [sorted(g) for g in enforced], (
        f"docs/architecture.md's layer line {line!r} is not the order of test_imports.LAYERS")


def test_every_path_it_names_exists():
    text = PAGE.read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:interp|docs|tests)/[\w/.]+)`", text))
    package_files = {m for m in re.findall(r"`(\w+\.py)`", text)}
    assert len(named) > 20
    missing = sorted(p for p in named if not (REPO / p.rstrip("/")).exists())
    assert missing == [], f"docs/architecture.md names files that do not exist: {missing}"
    everywhere = {p.name for p in [*(REPO / "interp").rglob("*.py"), *(REPO / "docs").glob("*.py"), *REPO.glob("*.py")]}
    assert sorted(package_files - everywhere) == [], "docs/architecture.md names a module that does not exist"


def test_the_catalogue_of_the_page_is_the_code():
    from interp.studies.catalog import THEMES

    text = PAGE.read_text(encoding="utf-8")
    for theme in THEMES:
        assert re.search(rf"^\s+{theme.name}/\s+configs\.py", text, re.M), f"theme {theme.name} is not on the page"
    # every study is listed by the generated API reference (docs/api-studies.md), so a new study's module need
    # not be pasted here; what the page names must exist (test_every_path_the_page_names_exists)


def _models_row(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| `interp/models/` |"))


def test_the_models_row_names_every_module_by_job():
    models = REPO / "interp" / "models"
    row = _models_row(PAGE.read_text(encoding="utf-8"))
    packages = sorted(p.name for p in models.iterdir() if (p / "__init__.py").is_file())
    assert [p for p in packages if f"`{p}/`" not in row] == [], "a sub-package of interp/models/ is not in its row"
    files = [p for p in models.rglob("*.py") if p.name != "__init__.py" and not {"families", "planted"} & set(
        p.relative_to(models).parts)]
    assert [str(p.relative_to(models)) for p in files if f"`{p.name}`" not in row] == []


def test_the_page_says_where_timm_attributes_are_read_and_the_test_that_checks_it():
    text = PAGE.read_text(encoding="utf-8")
    assert "Nothing outside `families/` reads a timm class's attributes" in text
    assert "`tests/contract/test_timm_attributes.py`" in text and "read a timm module's attributes outside `families/`" in (
        _models_row(text))
