"""``interp explore --sae DIR``: the SAE's artifact features listed with their maps, their ablation toggled (the
session, then the page in a real browser: skipped without chromium, as test_explore_browser.py). Reuses the SAE of
tests/sae_helpers.py."""
from __future__ import annotations

import pytest

import interp
from interp.explore.session import ExploreOptions, ExploreSession
from sae_helpers import HOOK, needs_overcomplete, planted_images, planted_model, planted_sae


@needs_overcomplete
def test_the_explorer_lists_the_artifact_features_and_toggles_their_ablation(one_thread):
    session = ExploreSession(planted_model(), planted_images(4, seed=5), ExploreOptions(sae=str(planted_sae())))
    sae = session.info()["sae"]
    assert sae["hook"] == HOOK and sae["features"] and len(sae["features"][0]["maps"]) == 4
    edit = [{"kind": "SAEFeatureAblation", "features": [f["feature"] for f in sae["features"]]}]
    runs = [session.run(i, edit) for i in range(4)]
    before = sum(r["baseline"]["outlier_count"] for r in runs)
    assert before > 0 and sum(r["outlier_count"] for r in runs) <= 0.1 * before
    assert runs[0]["edits"].startswith("ablate SAE features (zero)")
    assert len(session.export(edit)) > 0  # the patch file carries the SAE's tensors
    with pytest.raises(interp.InterpError, match="JSON integers"):
        session.run(0, [{"kind": "SAEFeatureAblation", "features": [1.0]}])


@needs_overcomplete
def test_the_explorer_page_toggles_an_sae_feature(tmp_path, one_thread):
    """In a real browser (skipped without chromium, as tests/test_explore_browser.py): the panel lists the artifact
    feature and ticking it removes the outliers of the shown image."""
    browser_tests = pytest.importorskip("test_explore_browser")
    browser_tests._need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from interp.explore.server import ExploreServer

    session = ExploreSession(planted_model(), planted_images(4, seed=5), ExploreOptions(sae=str(planted_sae())))
    server = ExploreServer(session).start()
    options = webdriver.ChromeOptions()
    options.binary_location = browser_tests.CHROMIUM
    for flag in (*browser_tests.FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=browser_tests.DRIVER), options=options)
    try:
        driver.get(server.url)
        browser_tests.wait_for(driver, "window.explorer && window.explorer.runs >= 1")
        boxes = driver.find_elements("css selector", "#sae-features input.sae-feature")
        assert len(boxes) == len(session.info()["sae"]["features"]) >= 1
        before = int(driver.find_element("id", "outlier-count").text)
        assert before > 0
        for box in boxes:  # the artifact subspace: the planted direction may be split over a few features
            done = browser_tests.runs(driver)
            box.click()
            browser_tests.wait_for(driver, f"window.explorer.runs > {done} && "
                                           "document.getElementById('status').textContent == 'ready'")
        spec = driver.execute_script("return window.explorer.spec")
        assert spec[0]["kind"] == "SAEFeatureAblation"
        assert int(driver.find_element("id", "outlier-count").text) <= 0.1 * before
    finally:
        driver.quit()
        server.stop()
