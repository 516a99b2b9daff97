"""The pages' claims about which models interp instruments are the registered families (issue 52, item 1).

The README, the getting-started page and the pyramid page hold the supported-models list between markers;
``docs/gen_cli.py`` fills it from the families (at build time, and ``python docs/gen_cli.py`` in the pages), as
it fills the CLI reference. These tests fail when a page and the families disagree.
"""
from __future__ import annotations

import re

from doc_examples import REPO, gen_cli
from interp._model_names import (SUPPORTED_MODELS_BEGIN, SUPPORTED_MODELS_END, declared_families,
                                 supported_models_markdown)
from interp.models.families import Family

README = REPO / "README.md"
DOCS = REPO / "docs"




def test_every_page_with_the_list_holds_the_families_list():
    hook = gen_cli()
    pages = hook.model_pages()
    assert README in pages and DOCS / "pyramid-models.md" in pages
    for page, link in pages.items():
        text = page.read_text(encoding="utf-8")
        assert SUPPORTED_MODELS_BEGIN in text and SUPPORTED_MODELS_END in text, f"{page.name} has no list"
        assert hook._fill_models(text, link) == text, (
            f"{page.name}'s supported-models list is not the registered families': run `python docs/gen_cli.py`")


def test_the_families_read_without_torch_are_the_registered_ones():
    """The torch-free read of the family class bodies (what the fast name check and the lists use) is the
    registry, in its order: a new family needs no list regenerated."""
    registered = [{"name": f.name, "title": f.title, "modules": sorted(m.rsplit(".", 1)[-1] for m in f.timm_modules),
                   "pyramid": f.stages_attr is not None} for f in Family.registry]
    assert declared_families() == registered


def test_the_list_names_every_registered_family_and_links_the_pyramid_page():
    listed = supported_models_markdown("pyramid-models.md").splitlines()
    assert len(listed) == len(Family.registry)
    for line, family in zip(listed, Family.registry):
        assert f"timm `{family.timm_class().__name__}`" in line
        assert ("[Pyramid models](pyramid-models.md)" in line) == (family.stages_attr is not None)
    assert any("DINOv3" in line for line in listed) and any("EVA02" in line for line in listed)


def test_the_pyramid_pages_family_table_has_a_row_per_family():
    text = (DOCS / "pyramid-models.md").read_text(encoding="utf-8")
    classes = re.findall(r"^\| [\w-]+ \| `(\w+)` \|", text, flags=re.M)
    assert sorted(classes) == sorted(f.timm_class().__name__ for f in Family.registry)


def _intro(text: str) -> str:
    """A page's text from its first sentence to its first ``##`` heading, links to docs/ made page-relative
    and the supported-models anchor left out (the README has the list, the docs home links it)."""
    body = text[text.index("`interp` is"): text.index("\n## ")]
    body = body.replace("](docs/", "](")
    return re.sub(r"\[Supported models\]\([^)]*\)", "[Supported models]", body)


def test_the_readme_and_the_docs_home_say_the_same_and_link_the_pyramid_page():
    readme, home = README.read_text(encoding="utf-8"), (DOCS / "index.md").read_text(encoding="utf-8")
    assert _intro(readme) == _intro(home)
    assert "pyramid-models.md" in _intro(home)
    assert "that a plain timm model loads" not in readme  # plain timm loads only the --as-weights export
