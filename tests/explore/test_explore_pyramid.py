"""``interp explore`` on a pyramid model (planted PVTv2): every block's map on its own stage's grid, the ranked
neurons and the outliers on the detection block's grid, the edits as on a ViT; and the page in a browser."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette", reason="the explore extra (pip install -e '.[explore]') is not installed")

import interp  # noqa: E402
from interp.explore.server import ExploreServer  # noqa: E402
from interp.explore.session import ExploreSession  # noqa: E402

from test_explore_browser import CHROMIUM, DRIVER, FLAGS, _need_browser, canvas_png, runs, wait_for  # noqa: E402

PLANTED = {"6": [17, 101, 402, 655]}  # stages.3.blocks.0
GRIDS = [[56, 56]] * 2 + [[28, 28]] * 2 + [[14, 14]] * 2 + [[7, 7]] * 2


@pytest.fixture(scope="module")
def session():
    return ExploreSession(interp.load("planted_pvt"), interp.models.sample_image_paths())


def test_every_block_on_its_stages_grid(session):
    info = session.info()
    assert info["grids"] == GRIDS and info["grid"] == [7, 7] and not info["has_cls"]
    assert {(n["layer"], n["neuron"]) for n in info["neurons"]["list"][:4]} == {(6, n) for n in PLANTED["6"]}
    out = session.run(3)
    assert [len(row) for row in out["norms"]] == [h * w for h, w in GRIDS]
    assert len(out["outliers"]) == 49 and out["outlier_count"] > 0 and out["cls_attention"] is None
    assert all(len(m["map"]) == 49 for m in out["neuron_maps"])  # the ranked neurons: stage 3's grid
    assert len(out["curves"]["resid_post"]["max"]) == 8
    early = session.run(3, [{"kind": "NeuronAblation", "neurons": {"1": [3]}}])  # a stage-0 neuron's map: 56 x 56
    assert len(next(m for m in early["neuron_maps"] if m["layer"] == 1)["map"]) == 56 * 56


def test_edits_move_the_outliers_as_on_a_vit(session):
    ablated = session.run(3, [{"kind": "NeuronAblation", "neurons": PLANTED}])
    assert ablated["baseline"]["outlier_count"] > 0 and ablated["outlier_count"] == 0
    moved = session.run(3, [{"kind": "Relocation", "neurons": PLANTED, "target": "box:1,1,2,2"}])
    on = torch.tensor(moved["outliers"]).reshape(7, 7).nonzero().tolist()
    assert on == [[1, 1], [1, 2], [2, 1], [2, 2]]


@pytest.fixture(scope="module")
def browser(session, tmp_path_factory):
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    server = ExploreServer(session).start()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.get(server.url)
    yield driver
    driver.quit()
    server.stop()


def test_the_page_draws_each_stage_on_its_grid(browser, session):
    """The block slider shows stage 0's 56 x 56 map and stage 3's 7 x 7 one (a map drawn on another grid throws:
    draw.js), the outliers of the planted tokens, and ablating the planted neurons removes them."""
    wait_for(browser, "window.explorer && window.explorer.runs >= 1")
    done = runs(browser)
    browser.find_element("css selector", '#thumbs img[data-index="3"]').click()
    wait_for(browser, f"window.explorer.runs > {done} && window.explorer.last.image == 3")
    assert int(browser.find_element("id", "outlier-count").text) == session.run(3)["outlier_count"] > 0
    last_stage = canvas_png(browser, "norm-map")
    browser.execute_script("const s = document.getElementById('block'); s.value = '0';"
                           "s.dispatchEvent(new Event('input'));")
    # a map drawn on the wrong grid throws in the slider's handler: the count line never names block 0
    wait_for(browser, "document.getElementById('map-count').textContent.endsWith('at block 0')", timeout=30)
    assert canvas_png(browser, "norm-map") != last_stage
    assert browser.find_element("id", "error").text == ""
    for box in browser.find_elements("css selector", "#neurons tr.planted input.neuron"):
        done = runs(browser)
        box.click()
        wait_for(browser, f"window.explorer.runs > {done} && document.getElementById('status').textContent == 'ready'")
    assert browser.execute_script("return window.explorer.last.outlier_count") == 0
    assert browser.find_element("id", "error").text == ""


def test_controls_of_edits_a_pyramid_does_not_define_are_refused_with_their_reason(session):
    """The page offered the test-time register, SelectiveCLS and the CLS head selector on a model with neither
    an extra-token slot nor a CLS token (issue 52, item 4): the info says why each one is off."""
    refused = session.info()["refused"]
    assert set(refused) == {"register", "selcls", "head"} and all(refused.values())
    assert "test-time registers are not defined" in refused["register"] and "no CLS token" in refused["selcls"]
    page = (Path(interp.explore.__file__).parent / "static")
    assert "disableRefused(info.refused" in (page / "app.js").read_text()
    draw = (page / "draw.js").read_text()
    assert "No prefix tokens" in draw and "ticks.has(label)" in draw  # no empty "norm ." and no repeated label
