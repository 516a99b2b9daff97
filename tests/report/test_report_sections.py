"""The report page's sections and wording: every study it runs has a numbered section (console steps alike), a
table of contents, one-line sections where a study says nothing on the data, cosines that differ from 1,
unambiguous labels, the outlier-share remark, small-sample flags, and a default image set large enough for the
probes. One report run per session (``default_report`` in conftest.py); variants re-render its summary."""
from __future__ import annotations

import copy
import html
import re
from pathlib import Path

import pytest

from interp.models import sample_image_paths
from interp.models.inputs.samples import SAMPLES_DIR
from interp.report import write_html
from interp.report.battery import REPORT_SAMPLES_DIR, report_sample_paths
from interp.plots.common import near_one
from interp.report.sections import SECTIONS, SKIPPED_STAGES, SMALL_SAMPLE, one_line_reasons, outlier_share_remark, section_index
from interp.studies.probes.scores import MIN_IMAGES

SAMPLE_NAMES = ["astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"]


def section_html(page: str, key: str) -> str:
    """The HTML of the section with id ``key`` (empty when there is none)."""
    found = re.search(rf'<section id="{key}">(.*?)</section>', page, re.S)
    return found.group(1) if found else ""


def rerender(tmp_path: Path, report: dict, figures_from: Path, **changes) -> str:
    """The page of ``report`` with ``changes`` applied (figures read from ``figures_from``)."""
    s = copy.deepcopy(report)
    s.update(changes)
    s["sections"] = section_index(s)
    out = tmp_path / "index.html"
    figures = {key: [] for key, _ in SECTIONS}
    write_html(out, s, figures)
    return out.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------ the default images
def test_the_four_samples_are_unchanged_and_the_report_adds_more():
    assert [p.name for p in sample_image_paths()] == SAMPLE_NAMES and sample_image_paths()[0].parent == SAMPLES_DIR
    more = sorted(REPORT_SAMPLES_DIR.glob("*.jpg"))
    assert not any(SAMPLES_DIR.rglob("*/*.jpg")) and len(sample_image_paths()) + len(more) >= MIN_IMAGES
    assert report_sample_paths() == sample_image_paths() + more
    assert sum(p.stat().st_size for p in more) < 2_000_000  # within a few MB
    licences = (REPORT_SAMPLES_DIR / "LICENSE.md").read_text(encoding="utf-8")
    for path in more:  # every added photo listed with its source and licence
        row = next(line for line in licences.splitlines() if f"| {path.name} |" in line)
        assert "skimage" in licences and re.search(r"CC0|public domain", row), row


def test_the_default_report_runs_on_enough_images_for_the_probes(default_report):
    r = default_report.report
    assert default_report.rc == 0 and r["n_images"] == len(report_sample_paths()) >= MIN_IMAGES
    assert r["probes"]["too_few"] is None
    scored = [g for probe in ("position", "pixels") for g in r["probes"][probe].values() if g["score"] is not None]
    assert scored  # the probes say something
    assert "probes.png" in default_report.page  # and the page shows them


# ------------------------------------------------------------------------------------------ sections
def test_every_study_the_report_runs_has_a_numbered_section(default_report):
    r, page = default_report.report, default_report.page
    studies = [name[:-5] for name in r["files"]["results"]]
    assert "redundancy" in studies
    for entry in r["sections"]:
        n, key, title = entry["number"], entry["key"], entry["title"]
        assert key in studies
        body = section_html(page, key)
        assert body.startswith(f"<h2>{n}. {title}</h2>"), key
    assert {e["key"] for e in r["sections"]} == set(studies)
    red = section_html(page, "redundancy")
    assert 'data-file="neighbour_similarity.png"' in red and "Median similarity" in red


def test_console_steps_match_the_page(default_report):
    steps = re.findall(r"interp report \[(\d+)/(\d+)\] (.+?): ", default_report.stderr)
    assert [(int(n), title) for n, _, title in steps] == [(e["number"], e["title"]) for e in
                                                         default_report.report["sections"]]
    assert {int(total) for _, total, _ in steps} == {len(SECTIONS)}


def test_the_page_has_a_table_of_contents(default_report):
    page = default_report.page
    toc = re.search(r'<nav class="toc">(.*?)</nav>', page, re.S).group(1)
    links = re.findall(r'<a href="#([a-z]+)">(\d+)\. ([^<]+)</a>', toc)
    assert [(key, int(n), title) for key, n, title in links] == [
        (e["key"], e["number"], e["title"]) for e in default_report.report["sections"]]
    assert all(f'<section id="{key}">' in page for key, _, _ in links)
    assert page.index('<nav class="toc">') < page.index('<section id="norms">')


def test_lost_on_random_weights_is_one_line(default_report):
    r = default_report.report
    assert r["random_weights"] is True
    lost = section_html(default_report.page, "lost")
    assert lost.count('<p class="caveat">') == 1 and "random weights" in lost and "<img" not in lost
    assert len(re.findall(r"<p\b", lost)) == 2  # the line and the data file
    entry = next(e for e in r["sections"] if e["key"] == "lost")
    assert entry["shown"] is False and "random weights" in entry["why"]


def test_probes_with_too_few_images_and_causal_stages_without_neurons_are_one_line(default_report, tmp_path):
    probes = dict(default_report.report["probes"], too_few="too few images (n=4) for a probe score; need >= 16")
    page = rerender(tmp_path, default_report.report, default_report.out, probes=probes, skipped="no neurons",
                    ablation=None, test_time_register=None, relocation=None)
    body = section_html(page, "probes")
    assert body.count("<p") == 2 and '<p class="caveat">Not scored: too few images (n=4)' in body
    for key in ("ablate", "registers", "relocate"):
        assert section_html(page, key).count("<p") == 1 and "Skipped" in section_html(page, key)
    assert page.count(SKIPPED_STAGES) == 1


# ------------------------------------------------------------------------------------------ wording
@pytest.mark.parametrize("value, shown", [(0.9999690170473705, "0.999969"), (0.9999997720051981, "0.99999977"),
                                          (0.9977346658706665, "0.9977"), (0.689, "0.689")])
def test_cosines_near_1_print_enough_digits_to_differ_from_1(value, shown):
    text = near_one(value)
    assert text.startswith(shown) and float(text.split()[0]) != 1.0
    assert near_one(1.0) == near_one(0.9999999999999999) == "1"  # rounding noise of an unedited run


def test_the_page_never_prints_a_changed_cosine_as_1(default_report):
    r, page = default_report.report, default_report.page
    b = r["behaviour"]
    assert b["metric"] == "pooled_cosine" and b["ablation"]["target"] < 1 - 1e-9
    row = re.search(r"<th>behaviour \(cosine[^<]*</th><td>([^<]+)</td>", page).group(1)
    assert f"register neurons {near_one(b['ablation']['target'])}" in row
    assert not re.search(r"register neurons 1\b", row) and not re.search(r"\u2192 1(;|$)", row)


def test_relocation_is_labelled_as_an_iou(default_report):
    r, page = default_report.report, default_report.page
    assert "relocation IoU</th>" not in page and "on images with outliers:" not in page
    label, value = re.search(r"<tr><th>(relocation[^<]*)</th><td>([^<]+)</td>", page).groups()
    assert "IoU" in label and "smiley" in label and "1 exactly on it" in label
    rl = r["relocation"]
    assert f"over all {rl['n_images']} images" in value and f"over the {rl['n_images_active']} images that had" in value
    assert 0 < rl["n_images_active"] <= rl["n_images"] == r["n_images"]


def test_an_outlier_share_far_above_the_papers_gets_a_remark(default_report):
    r = default_report.report
    assert r["outlier_fraction"] > 0.10 and "far above the few per cent" in r["outlier_share_remark"]
    assert r["outlier_share_remark"] in default_report.page.replace("&#x27;", "'")
    s = {"outlier_fraction": 0.1798, "outlier_counts": [10, 0, 12, 119], "grid": [14, 14], "synthetic": False,
         "image_ids": ["/x/astronaut.jpg", "/x/chelsea.jpg", "/x/coffee.jpg", "/x/rocket.jpg"]}
    assert "rocket: 119 of 196 patches" in outlier_share_remark(s) and "--threshold" in outlier_share_remark(s)
    assert outlier_share_remark(dict(s, outlier_fraction=0.02)) is None


def test_verdicts_from_few_images_are_flagged_small_sample(default_report, tmp_path):
    assert default_report.report["small_sample"] is False and "Small sample." not in default_report.page
    n = SMALL_SAMPLE - 1
    page = rerender(tmp_path, default_report.report, default_report.out, n_images=n, small_sample=True)
    assert f"<strong>Small sample.</strong> {n} images" in page
    for label in ("high-norm tokens found", "register neurons", "planted neurons recovered", "relocation"):
        row = re.search(rf"<tr><th>{label}[^<]*</th><td>([^<]+)</td>", page).group(1)
        assert f"small sample: {n} images" in row, label


def test_one_line_reasons_name_what_is_missing():
    s = {"model": "m", "synthetic": False, "random_weights": False, "skipped": None,
         "probes": {"too_few": None}, "lost": {"degenerate": False, "note": None},
         "redundancy": {"high_norm": {"median": 0.9, "note": None}}}
    assert one_line_reasons(s) == {}
    assert set(one_line_reasons(dict(s, random_weights=True, skipped="x"))) == {"lost", "ablate", "registers",
                                                                                 "relocate"}


def test_a_study_the_model_cannot_run_stays_on_the_page_with_its_reason(default_report, tmp_path):
    """A pyramid runs no LOST and no test-time register: the sections stay numbered on the page, each one line
    saying why (they vanished, the reason only on the console: issue 52, item 3)."""
    not_run = {"lost": "Not run: LOST is not defined for a pyramid model (it reads one grid of patch keys).",
               "registers": "Not run: test-time registers are not defined here (no place for an extra token)."}
    page = rerender(tmp_path, default_report.report, default_report.out, lost=None, test_time_register=None,
                    not_run=not_run)
    for key, why in not_run.items():
        body = section_html(page, key)
        assert body.count('<p class="caveat">') == 1 and html.escape(why) in body and "<img" not in body
        assert f'href="#{key}"' in page
    entries = {e["key"]: e for e in section_index(dict(default_report.report, lost=None, not_run=not_run))}
    assert all(entries[key]["shown"] is False and entries[key]["why"] == why for key, why in not_run.items())
