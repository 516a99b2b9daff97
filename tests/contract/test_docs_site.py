"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict`` (no broken link or
anchor, no page outside the navigation, no API entry that no longer exists), its CLI reference is generated from
the parsers without torch, it needs no network, and every code block of its pages runs as written (the
conventions of ``tests/doc_examples.py``, as for the README)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from doc_examples import REPO, code_blocks, gen_cli, not_ignored, root_mirror, run_page, written_files

DOCS = REPO / "docs"


# What a page's examples read but do not write themselves: cache-format.md's "reading without interp" reads
# an `acts.h5` holding blocks.11 (a 12-block ViT), as `interp cache` writes it.
PAGE_SETUP = {"cache-format.md": ["cache", "vit_small_patch16_224", "--no-pretrained", "--images", "interp/data/samples",
                                  "--hooks", "blocks.11.hook_resid_post", "--out", "acts.h5", "--no-progress"]}
PAGES_WITH_EXAMPLES = sorted(p.name for p in DOCS.glob("*.md")
                             if any(b.skip is None for b in code_blocks(p.read_text(encoding="utf-8"))))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once with ``mkdocs build --strict`` into a temporary folder (in process)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    out = tmp_path_factory.mktemp("site")
    build(load_config(str(REPO / "mkdocs.yml"), site_dir=str(out), strict=True))
    return out


def test_the_site_builds_strict_and_has_every_section(site):
    for page in ("index", "getting-started", "cli", "api-studies", "contributing", "architecture", "methods"):
        assert (site / f"{page}.html").is_file(), page
    cli = (site / "cli.html").read_text(encoding="utf-8")
    assert "interp study norms" in cli and "--threshold" in cli and "interp patch export" in cli
    api = (site / "api-studies.html").read_text(encoding="utf-8")
    assert "detection" in api  # rendered from the docstrings


def test_the_generated_tables_list_every_study(site):
    """The API page has every declared study function and the cache page every cacheable study, from the
    catalogue at build time (a new study appears without a line of docs to paste)."""
    from interp.studies.catalog import declared

    api = (site / "api-studies.html").read_text(encoding="utf-8")
    cache_page = (site / "hooks-and-cache.html").read_text(encoding="utf-8")
    for config in declared().values():
        assert f'id="{config.module}.{config.function}"' in api, config.function
        assert f"<code>{config.name}</code>" in cache_page, config.name
    assert "study-api" not in api and "study-cache-table" not in cache_page  # the markers were filled


def test_the_site_needs_no_network(site):
    """No font, script or style sheet from another host: the built pages open offline."""
    external = re.compile(r"""<(?:link|script|img)\b[^>]*\b(?:href|src)=["'](?:https?:)?//""", re.I)
    hits = [f"{page.relative_to(site)}: {m.group(0)}" for page in site.rglob("*.html")
            for m in external.finditer(page.read_text(encoding="utf-8"))]
    assert hits == []
    assert not any("fonts.googleapis" in p.read_text(encoding="utf-8", errors="ignore")
                   for p in site.rglob("*.css"))


def test_the_cli_reference_is_every_parser_and_needs_no_torch():
    """docs/gen_cli.py writes a section per command from build_parser(), with torch made unimportable."""
    script = ("import runpy, sys; sys.modules['torch'] = None; "
              "print(runpy.run_path('docs/gen_cli.py')['cli_reference']())")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from interp.cli import build_parser

    commands = [" ".join(words) for words, _ in gen_cli().walk(build_parser())]
    assert {"interp", "interp study norms", "interp study segment", "interp cache", "interp explore"} <= set(commands)
    headings = re.findall(r"^#+ `([^`]+)`$", done.stdout, flags=re.M)
    assert headings == commands


def test_docstring_examples_become_code_blocks():
    import markdown

    md = markdown.Markdown(extensions=[gen_cli().DoctestBlocks(), "fenced_code"])
    text = ("Intro [a][b], :class:`~pkg.mod.Name`, :func:`pkg.f`.\n\n>>> x = [1][0]\n>>> x\n1\n\nAfter.\n\n"
            "```python\n>>> kept\n```\n")
    html = md.convert(text)
    assert html.count("<pre>") == 2 and "x = [1][0]" in html and "<p>After.</p>" in html
    assert "<code>Name</code>" in html and "<code>pkg.f</code>" in html and ":class:" not in html


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES)
def test_docs_page_examples_run(page, tmp_path, monkeypatch):
    """Every python and bash block of the page runs in order, from a copy of the repository root, on the
    bundled default, and writes only git-ignored files."""
    root = root_mirror(tmp_path / "root")
    monkeypatch.chdir(root)
    monkeypatch.setenv("INTERP_NO_PROGRESS", "1")
    if page in PAGE_SETUP:
        from interp.cli import main

        assert main(PAGE_SETUP[page]) == 0
    assert run_page(DOCS / page, root) >= 1
    written = written_files(root)
    assert not not_ignored(written), f"{page}'s examples wrote files git does not ignore: {not_ignored(written)}"


def test_every_page_with_code_runs_or_says_why_not():
    """Skipped blocks name their reason; the big pages keep running examples."""
    for page in DOCS.glob("*.md"):
        for block in code_blocks(page.read_text(encoding="utf-8")):
            assert block.skip is None or block.skip.strip(), f"{page.name} line {block.line}: skip without a reason"
    assert {"getting-started.md", "hooks-and-cache.md", "study-scripts.md", "studies-artifacts.md",
            "studies-aggregation.md", "studies-tokens.md", "interventions.md"} <= set(PAGES_WITH_EXAMPLES)
