"""Study results render themselves in Jupyter: ``_repr_html_`` gives a summary table and inline figures."""
from __future__ import annotations

import base64
import dataclasses
import importlib
import pkgutil
import re
from html.parser import HTMLParser

import pytest

import interp
import interp.studies
from interp.studies.core.result import StudyResult

VOID = {"img", "br", "hr", "meta", "input", "col", "wbr"}


class BalancedParser(HTMLParser):
    """Parses HTML and records unbalanced tags (html.parser itself never rejects anything)."""

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.images, self.text = [], [], [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> BalancedParser:
    parser = BalancedParser()
    parser.feed(html)
    parser.close()
    assert not parser.errors and not parser.stack, (parser.errors, parser.stack)
    return parser


def result_classes():
    # every module of every theme package (core/, artifacts/, ...), whatever other tests imported before
    for module in pkgutil.walk_packages(interp.studies.__path__, "interp.studies."):
        importlib.import_module(module.name)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    return sorted(set(subclasses(StudyResult)), key=lambda c: c.__name__)


def test_every_result_class_is_found():
    names = {c.study for c in result_classes()}
    assert {"norms", "neurons", "ablate", "relocate", "registers", "pib", "masking"} <= names


@pytest.mark.parametrize("cls", result_classes(), ids=lambda c: c.__name__)
def test_empty_result_renders(cls):
    """A result with default (empty) fields still renders: figures it cannot draw become a note."""
    result = cls(model="tiny<vit>", fingerprint="abc", params={"top_k": 3, "images": "a&b"}, seed=0)
    html = result._repr_html_()
    parsed = parse(html)
    text = "".join(parsed.text)
    assert f"{cls.study} study" in text
    assert "tiny<vit>" in text and "<vit>" not in html  # escaped
    for field in dataclasses.fields(cls):
        assert field.name in text


@pytest.fixture(scope="module")
def planted_results():
    from interp.studies import open_source
    from interp.studies.artifacts.neurons import neurons_study
    from interp.studies.artifacts.norms import norms_study

    model = interp.load("planted_vit")
    source = open_source(model=model, images=interp.models.sample_image_paths())
    norms = norms_study(source, progress=False)
    neurons = neurons_study(source, top_k=4, progress=False)
    return norms, neurons


def test_real_results_show_values_and_figures(planted_results):
    norms, neurons = planted_results
    parsed = parse(norms._repr_html_())
    text = "".join(parsed.text)
    assert f"{norms.threshold:.4g}" in text and "artifacts_found" in text
    # norms has three figures (profile, histograms, outlier maps), each a decodable PNG
    assert len(parsed.images) == 3
    for image in parsed.images:
        data = re.fullmatch(r"data:image/png;base64,([A-Za-z0-9+/=]+)", image["src"]).group(1)
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    neuron_parsed = parse(neurons._repr_html_())
    assert [img["alt"] for img in neuron_parsed.images] == ["neuron_scores"]
    assert f"list of {len(neurons.neurons)}" in "".join(neuron_parsed.text)
