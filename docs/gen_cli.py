"""MkDocs hook: the pages that restate the code are generated from it at build time, and ``>>>`` examples in
docstrings show as code in the API reference.

Markers and what replaces them (all torch-free):

* ``<!-- cli-reference -->`` (``docs/cli.md``): ``interp``'s own argparse parsers' help, below;
* ``<!-- study-cache-table -->`` (``docs/hooks-and-cache.md``): the hooks each study reads from a cache
  (:func:`interp.studies.catalog.cache_table`);
* ``<!-- study-api -->`` (``docs/api-studies.md``): a mkdocstrings entry per declared study function, theme by
  theme (:func:`interp.studies.catalog.api_reference`);
* the supported-models markers (``docs/getting-started.md``, ``pyramid-models.md``, and
  ``README.md``, which no build reads): the registered model families, one bullet each
  (:func:`interp._model_names.supported_models_markdown`). The pages hold the list too, so that they read on
  GitHub; ``python docs/gen_cli.py`` rewrites it there after a new family, and
  ``tests/contract/test_supported_models.py`` checks it.

``docs/cli.md`` holds the marker ``<!-- cli-reference -->``; at build time it is replaced by one section per
command and sub-command (``interp study norms``, ``interp patch export``, ...), each the ``--help`` text that
command prints. Building the parsers imports no torch (``interp/cli.py``), so neither does the docs build.
The checkout the docs are built from is documented, not an installed copy: its root goes first on the path.

The docstrings write examples as bare ``>>>`` lines (they run as doctests) and cross-references as Sphinx
roles (``:class:`~pkg.Name` ``); in Markdown the first would run into the paragraph around them and the second
show as typed, so :class:`DoctestBlocks` fences each run of ``>>>`` lines as ``pycon`` and shows a role as the
name in code.
"""
from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

from markdown import Extension
from markdown.preprocessors import Preprocessor
from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- cli-reference -->"
WIDTH = 80  # help text is wrapped at this width, whatever the terminal the build runs in
ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):`(~?)([^`]+)`")


def subcommands(parser: argparse.ArgumentParser) -> List[Tuple[str, argparse.ArgumentParser]]:
    """The (name, parser) pairs of ``parser``'s sub-commands, in the order they were added."""
    found = []
    for action in parser._actions:  # argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            found += [(a.dest, action.choices[a.dest]) for a in action._choices_actions]
    return found


def walk(parser: argparse.ArgumentParser, words: Tuple[str, ...] = ("interp",)
         ) -> Iterator[Tuple[Tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the command tree, depth first: (the command's words, its parser)."""
    yield words, parser
    for name, child in subcommands(parser):
        yield from walk(child, words + (name,))


def help_text(parser: argparse.ArgumentParser) -> str:
    """``parser.format_help()`` at :data:`WIDTH` columns."""
    shown = parser.formatter_class
    parser.formatter_class = functools.partial(shown, width=WIDTH)
    try:
        return parser.format_help()
    finally:
        parser.formatter_class = shown


def cli_reference() -> str:
    """The Markdown of the CLI reference: a heading and a text block of ``--help`` per command."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from interp.cli import build_parser

    parts = []
    for words, parser in walk(build_parser()):
        level = "#" * min(len(words) + 1, 4)
        parts.append(f"{level} `{' '.join(words)}`\n\n```text\n{help_text(parser).rstrip()}\n```\n")
    return "\n".join(parts)


def _role_as_code(match: re.Match) -> str:
    """``:class:`~a.b.C` `` -> `` `C` ``; without ``~`` the whole dotted name."""
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


class _FenceDoctests(Preprocessor):
    """Wrap each run of ``>>>`` lines (with the continuation and output lines up to a blank line) in a fence;
    outside code, show Sphinx roles as code."""

    def run(self, lines: List[str]) -> List[str]:
        out, fenced, in_example = [], False, False
        for line in lines:
            stripped = line.lstrip()
            if stripped.startswith(("```", "~~~")) and not in_example:
                fenced = not fenced
            elif not fenced and not in_example and stripped.startswith(">>>"):
                indent = line[: len(line) - len(stripped)]
                out += ["", f"{indent}```pycon"]
                in_example = True
            elif in_example and not stripped:
                out.append(f"{indent}```")
                in_example = False
            if not fenced and not in_example:
                line = ROLE.sub(_role_as_code, line)
            out.append(line)
        if in_example:
            out.append(f"{indent}```")
        return out


class DoctestBlocks(Extension):
    """Markdown extension: docstring examples (``>>>`` lines) become ``pycon`` code blocks."""

    def extendMarkdown(self, md) -> None:
        md.preprocessors.register(_FenceDoctests(md), "interp_doctests", 29)  # before the fence extensions


@event_priority(100)  # before mkdocstrings reads the extension list for its own Markdown
def on_config(config):
    """MkDocs event: add :class:`DoctestBlocks` to the site's Markdown extensions."""
    config.markdown_extensions.append(DoctestBlocks())
    return config


def generated() -> Dict[str, Callable[[], str]]:
    """Each marker and the function that writes what replaces it."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from interp.studies.catalog import api_reference, cache_table

    return {MARKER: cli_reference, "<!-- study-cache-table -->": cache_table, "<!-- study-api -->": api_reference}


def on_page_markdown(markdown: str, page, config, files) -> str:
    """MkDocs event: fill the markers of the generated pages."""
    for marker, write in generated().items():
        if marker in markdown:
            markdown = markdown.replace(marker, write())
    return _fill_models(markdown, "pyramid-models.md")


def _fill_models(text: str, pyramid_page: str) -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from interp._model_names import fill_supported_models

    return fill_supported_models(text, pyramid_page)


def model_pages() -> Dict[Path, str]:
    """The pages holding the supported-models list, each with the link its pyramid families take."""
    pages = {ROOT / "README.md": "docs/pyramid-models.md"}
    pages.update({ROOT / "docs" / name: "pyramid-models.md"
                  for name in ("getting-started.md", "pyramid-models.md")})
    return pages


if __name__ == "__main__":
    for page, link in model_pages().items():
        page.write_text(_fill_models(page.read_text(encoding="utf-8"), link), encoding="utf-8")
        print(f"filled {page.relative_to(ROOT)}")
