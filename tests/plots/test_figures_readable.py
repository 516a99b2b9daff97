"""Figures and report pages a reader takes in at a glance (issue 12, points 7 and 5): norm distributions that
read the same for few and many images, no colour bar, legends off the data, outlier outlines that show on any
image, one note for skipped stages, and the input geometry in the summary."""
from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgb

import interp
import interp.plots as plots
from interp.plots.common import OVERLAY_COLORS, overlay_color
from interp.plots.norms import _block_quantiles, _ridges
from interp.report import write_html
from interp.report.sections import SKIPPED_STAGES
from interp.report.summary import input_geometry
from interp.studies import open_source
from interp.studies.artifacts.norms import HIST_EDGES, norms_study

from conftest import images, make_model


@pytest.fixture(scope="module")
def planted_norms():
    """The norms study of the planted model on 2 random images with a flat corner (it has outliers)."""
    x = images(2)
    x[:, :, :64, :64] = 0.3
    return norms_study(open_source(model=interp.load("planted_vit"), images=x), progress=False), x


def _bin(norm: float) -> int:
    """The fine histogram bin (~0.5 % wide) that holds ``norm``."""
    return int(np.searchsorted(HIST_EDGES, norm)) - 1


class _Hist:
    """A stand-in result holding one block's histogram: ``counts`` at fine-bin indices ``bins``."""

    def __init__(self, bins, counts):
        start = min(bins)
        row = np.zeros(max(bins) - start + 1, np.int64)
        row[np.asarray(bins) - start] = counts
        self.histograms = {"resid_post": [{"start": start, "counts": row.tolist()}]}
        self.hist_edges = HIST_EDGES.tolist()


def test_quantiles_from_the_binned_histogram_are_exact_to_a_bin():
    low, high = _bin(10), _bin(224)
    q, lo, hi, totals = _block_quantiles(_Hist([low, high], [75, 25]), "resid_post")
    assert totals[0] == 100
    assert q[0, 2] == pytest.approx(10, rel=0.01) and q[0, 4] == pytest.approx(224, rel=0.01)
    assert lo[0] == pytest.approx(10, rel=0.01) and hi[0] > q[0, 4]


@pytest.mark.parametrize("n_tokens", [4, 4_000_000])
def test_density_ridges_separate_two_modes_for_few_and_many_tokens(n_tokens):
    """Two modes a decade apart stay two bumps with an empty valley, whether 4 tokens or millions."""
    result = _Hist([_bin(10), _bin(100)], [n_tokens // 2, n_tokens // 2])
    xs, heights = _ridges(result, "resid_post", (5, 200))
    row = heights[0]
    at = lambda v: row[np.argmin(np.abs(xs - v))]  # noqa: E731
    assert at(10) > 0.9 and at(100) > 0.9 and at(31.6) < 0.05
    assert row.max() == pytest.approx(1.0)


def test_norm_histograms_have_no_colour_bar_and_legends_off_the_axes(planted_norms):
    result, _ = planted_norms
    fig = plots.norms.norm_histograms(result)
    assert not any(hasattr(ax, "_colorbar") for ax in fig.axes)  # one scale, read on the axes themselves
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    assert fig.legends[0]._loc in (8, "lower center") or "lower" in str(fig.legends[0]._loc)
    texts = " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
    assert "threshold" in texts and "share of patch tokens" in texts


@pytest.mark.parametrize("background", [(0.8, 0.1, 0.1), (0.95, 0.55, 0.1), (1.0, 0.92, 0.23), (0.05, 0.05, 0.05)])
def test_overlay_colour_stands_out_against_red_orange_yellow_and_black(background):
    image = np.ones((64, 64, 3)) * np.asarray(background)
    chosen = np.asarray(to_rgb(overlay_color(image)))
    assert np.linalg.norm(chosen - np.asarray(background)) > 0.6


def test_outlier_maps_outline_the_outliers_on_a_red_image(planted_norms):
    result, x = planted_norms
    red = x.clone()
    red[:, 0], red[:, 1], red[:, 2] = 0.85, 0.1, 0.1  # a red photo
    fig = plots.norms.outlier_maps(result, images=red)
    for ax in fig.axes[:2]:
        outlines = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(outlines) == 1 and outlines[0].get_path_effects()  # contour with a dark halo
        colour = np.asarray(outlines[0].get_colors()[0][:3])
        assert np.linalg.norm(colour - np.asarray([0.85, 0.1, 0.1])) > 0.6
        assert tuple(outlines[0].get_colors()[0][:3]) in {to_rgb(c) for c in OVERLAY_COLORS}


def test_relocation_target_and_outliers_get_different_colours(planted_norms):
    from interp.plots.common import TARGET_COLOR

    grid = np.zeros((14, 14), bool)
    grid[2:4, 2:4] = True
    assert all(overlay_color(np.zeros((8, 8, 3)) + c, grid, avoid=[TARGET_COLOR]) != TARGET_COLOR
               for c in (0.0, 0.5, 1.0))


def _skipped_summary(**extra):
    return json.loads(json.dumps({
        "model": "m", "fingerprint": "f", "synthetic": False, "n_images": 4, "input_size": [224, 224],
        "patch_size": [14, 14], "grid": [16, 16], "n_prefix": 5, "n_registers": 4,
        "artifacts_found": False, "threshold": None, "threshold_method": "auto", "detect_layer": 11,
        "outlier_fraction": 0.0, "emergence": None, "neurons": [], "highest_layer": 11, "top_k": 10,
        "neurons_message": "no outlier tokens at block 11: nothing to rank",
        "skipped": "no register neurons to test (no outlier tokens at block 11: nothing to rank); the ablation, "
                   "test-time register and relocation studies need neurons and were not run",
        "ablation": None, "test_time_register": None, "relocation": None, "planted": None, "seconds": 1.0,
        **extra}))


def test_report_page_says_once_why_stages_were_skipped_and_shows_the_input(tmp_path):
    write_html(tmp_path / "index.html", _skipped_summary(), {"norms": ["norm_profile.png"]})
    page = (tmp_path / "index.html").read_text()
    assert page.count("nothing to rank") == 1  # the neuron study's reason, in its own section only
    assert page.count(SKIPPED_STAGES) == 1 and page.count("were not run") == 0
    assert ("224 x 224 px (timm&#x27;s own preprocessing), 14 px patches \u2192 16 x 16 grid, 5 prefix tokens "
            "(CLS + 4 registers)") in page


def test_input_geometry_of_a_register_model():
    source = open_source(model=make_model("dinov2_reg"), images=images(1))
    assert input_geometry(source) == {"input_size": [224, 224], "patch_size": [14, 14], "grid": [16, 16],
                                      "n_prefix": 5, "n_registers": 4, "preprocess": "model", "stage_grids": []}


# ----------------------------------------------------------------------------------------- issue 18, point 19
def _fake_png(folder, name):
    (folder / name).write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 64)
    return name


def test_sections_that_say_nothing_get_a_one_line_caveat_instead_of_the_figure(tmp_path):
    from html import escape

    from interp.report.html import PLANTED_PROBES_CAVEAT

    caveat_text = escape(PLANTED_PROBES_CAVEAT)
    too_few = "too few images (n=4) for a probe score; need >= 16"
    probes = {"hook": "blocks.11.hook_resid_post", "notes": [], "too_few": too_few, "label": {},
              "position": {"normal": {"n": 256, "score": None, "chance": None, "note": too_few}},
              "pixels": {"normal": {"n": 256, "score": None, "chance": None, "note": too_few}}}
    lost = {"hook": "blocks.11.attn.hook_k", "k": 100, "n_images": 4, "tied_seeds": 4, "corloc": None,
            "degenerate": True, "note": "degenerate: on every image (4 of 4) ... DINO ViT-S/16"}
    figures = {"probes": [_fake_png(tmp_path, "probes.png")], "lost": [_fake_png(tmp_path, "lost_boxes.png")],
               "norms": [_fake_png(tmp_path, "norm_profile.png"), _fake_png(tmp_path, "outlier_maps.png")],
               "neurons": [_fake_png(tmp_path, "neuron_scores.png")]}
    write_html(tmp_path / "index.html", _skipped_summary(probes=probes, lost=lost, n_prefix=1, n_registers=0),
               figures)
    page = (tmp_path / "index.html").read_text()
    assert f'<p class="caveat">Not scored: {too_few.replace(">", "&gt;")}' in page
    assert '<p class="caveat">Degenerate result, not drawn: on every image (4 of 4)' in page
    for silent in ("probes.png", "lost_boxes.png", "outlier_maps.png", "neuron_scores.png"):
        assert f'data-file="{silent}"' not in page, silent  # no empty or meaningless figure
    assert 'data-file="norm_profile.png"' in page and "src=\"data:image/png;base64," in page
    assert "1 prefix token (CLS)" in page and "1 prefix tokens" not in page
    assert caveat_text not in page

    scored = {**probes, "too_few": None,
              "pixels": {"high_norm": {"n": 64, "score": 0.994, "chance": -0.1, "note": None}}}
    write_html(tmp_path / "index.html", _skipped_summary(probes=scored, synthetic=True), figures)
    page = (tmp_path / "index.html").read_text()
    quote = page.index("high-norm tokens hold little local information")
    caveat, number = page.index(caveat_text), page.index("high-norm 0.994")
    assert quote < caveat < number and 'data-file="probes.png"' in page  # the caveat right below the quote


def test_norm_profile_ticks_blocks_and_marks_the_attention_and_mlp_steps_apart(planted_norms):
    from interp.plots.norms import AFTER_ATTN, AFTER_MLP, norm_profile

    norms, _ = planted_norms
    n = len(norms.max_patch_norm["resid_post"])
    fig = norm_profile(norms)
    ax, twin = fig.axes[0], fig.axes[1]
    assert list(ax.get_xticks()) == list(range(n))                             # one tick per block, centred
    assert ax.get_xlim() == (-0.5, n - 0.5)
    lines = [line for line in ax.lines if line.get_marker() in ("o", "s")]
    attn_x = sorted({round(x, 3) for line in lines if line.get_marker() == "o" for x in line.get_xdata()})
    mlp_x = sorted({round(x, 3) for line in lines if line.get_marker() == "s" for x in line.get_xdata()})
    assert attn_x == [round(i + AFTER_ATTN, 3) for i in range(n)] and mlp_x == [round(i + AFTER_MLP, 3) for i in range(n)]
    assert list(twin.lines[0].get_xdata()) == pytest.approx([i + AFTER_ATTN for i in range(n)])  # not at x.75
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "after attention (resid_mid)" in labels and "after MLP (resid_post)" in labels


def test_outline_colours_one_control_legend_and_labels_clear_of_the_dots(planted_norms):
    from interp.plots.causal import ablation_bars, register_summary
    from interp.studies.artifacts.ablate import AblateResult
    from interp.studies.artifacts.registers import RegistersResult

    norms, x = planted_norms
    fig = plots.norms.outlier_maps(norms, x.clamp(0, 1))
    legend = fig.legends
    titles = [ax.get_title() for ax in fig.axes]
    assert all(not t.endswith("\n1 outlier patches") for t in titles)  # "1 outlier patch"
    from interp.plots.common import plural
    assert (plural(1, "outlier patch"), plural(2, "outlier patch"), plural(1, "outlier")) == (
        "1 outlier patch", "2 outlier patches", "1 outlier")
    assert len(legend) == 1 and "outlier patch: norm >" in legend[0].get_texts()[0].get_text()

    cond = {"outlier_count": 10, "max_norm": 600.0, "top1_agreement": 1.0}
    ablation = AblateResult(model="m", fingerprint="", params={}, seed=0, neurons={2: [1]}, n_images=2,
                            controls=[{2: [3]}, {2: [4]}, {2: [5]}],
                            conditions={"baseline": cond, "target": {**cond, "outlier_count": 0},
                                        **{f"control_{i}": cond for i in range(3)}},
                            summary={m: {"baseline": v, "target": v, "control_mean": v, "control_std": 0.0}
                                     for m, v in cond.items()})
    fig = ablation_bars(ablation)
    texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert texts.count("one control") == 1 and not any(ax.get_legend() for ax in fig.axes)

    reg = RegistersResult(model="m", fingerprint="", params={}, seed=0, neurons={2: [1]}, ids=["a", "b", "c"],
                          threshold=266.0, baseline={"outlier_count": 151, "max_patch_norm": 616.0},
                          with_register={"outlier_count": 0, "max_patch_norm": 142.0},
                          register_norm=[600.0, 600.0, 600.0])
    fig = register_summary(reg)
    fig.canvas.draw()
    ax = fig.axes[1]
    label = next(t for t in ax.texts if t.get_text() == "600")
    dots = next(line for line in ax.lines if line.get_marker() == "o")
    box = label.get_window_extent()
    dot_tops = ax.transData.transform(np.column_stack([dots.get_xdata(), dots.get_ydata()]))[:, 1] + 3.5
    assert box.y0 > dot_tops.max()                                              # the "600" sits above the dots
