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
from interp.plots import artifacts as plots
from interp.plots.common import OVERLAY_COLORS, overlay_color
from interp.plots.norms import _block_quantiles, _ridges
from interp.report import write_html
from interp.report.html import SKIPPED_STAGES
from interp.report.summary import input_geometry
from interp.studies import open_source
from interp.studies.norms import HIST_EDGES, norms_study

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
    fig = plots.norm_histograms(result)
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
    fig = plots.outlier_maps(result, images=red)
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
    assert "224 x 224 px, 14 px patches \u2192 16 x 16 grid, 5 prefix tokens (CLS + 4 registers)" in page


def test_input_geometry_of_a_register_model():
    source = open_source(model=make_model("dinov2_reg"), images=images(1))
    assert input_geometry(source) == {"input_size": [224, 224], "patch_size": [14, 14], "grid": [16, 16],
                                      "n_prefix": 5, "n_registers": 4}
