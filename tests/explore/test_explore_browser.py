"""``interp explore`` in a real browser: Debian's headless chromium driven by Selenium through Debian's
chromium-driver (nothing downloads a browser). One server and one browser for the module.

In CI (``CI`` set) a missing chromium or driver FAILS these tests (``.ci/run`` installs them); elsewhere it
skips them, saying what to install.
"""
from __future__ import annotations

import base64
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette", reason="the explore extra (pip install -e '.[explore]') is not installed")

import interp  # noqa: E402
from interp.explore.server import ExploreServer  # noqa: E402
from interp.explore.session import ExploreSession  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1100")


def _need_browser():
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromium-driver", DRIVER)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if not missing:
        return
    message = f"browser tests need {', '.join(missing)}: apt-get install -y chromium chromium-driver"
    if os.environ.get("CI"):
        pytest.fail(message)  # CI installs them (.ci/run): missing there is a failure, not a skip
    pytest.skip(message)


@pytest.fixture(scope="module")
def served():
    torch.manual_seed(0)
    session = ExploreSession(interp.load("planted_vit"), interp.models.sample_image_paths())
    server = ExploreServer(session).start()
    yield session, server
    server.stop()


@pytest.fixture(scope="module")
def browser(served, tmp_path_factory):
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    downloads = tmp_path_factory.mktemp("downloads")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.downloads = downloads
    driver.get(served[1].url)
    yield driver
    driver.quit()


def wait_for(driver, script, timeout=600.0):
    """Poll a JS expression until it is truthy; returns its value (``timeout``: a safety net against a hung page,
    not a speed limit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(f"return {script};")
        if value:
            return value
        time.sleep(0.05)
    error = driver.execute_script("return document.getElementById('error').textContent")
    raise AssertionError(f"timed out waiting for {script}; page error: {error!r}")


def runs(driver) -> int:
    return int(driver.find_element("id", "status").get_attribute("data-runs"))


def canvas_png(driver, element_id) -> bytes:
    url = driver.execute_script(f"return document.getElementById('{element_id}').toDataURL('image/png');")
    return base64.b64decode(url.split(",", 1)[1])


def test_ablating_the_planted_neurons_removes_the_outliers(browser, served):
    session, _ = served
    wait_for(browser, "window.explorer && window.explorer.runs >= 1")
    before = int(browser.find_element("id", "outlier-count").text)
    assert before > 0 and before == session.run(0)["outlier_count"]
    map_before, attn_before = canvas_png(browser, "norm-map"), canvas_png(browser, "attn-map")
    planted = browser.find_elements("css selector", "#neurons tr.planted input.neuron")
    assert len(planted) == 4
    for box in planted:
        done = runs(browser)
        box.click()
        wait_for(browser, f"window.explorer.runs > {done} && document.getElementById('status').textContent == 'ready'")
    assert browser.find_element("id", "outlier-count").text == "0"
    assert browser.execute_script("return window.explorer.last.outlier_count") == 0
    assert canvas_png(browser, "norm-map") != map_before
    assert canvas_png(browser, "attn-map") != attn_before
    assert "cosine" in browser.find_element("id", "readout-metric").text  # planted head: not a classifier


def test_another_image(browser, served):
    session, _ = served
    done = runs(browser)
    browser.find_element("css selector", '#thumbs img[data-index="2"]').click()
    wait_for(browser, f"window.explorer.runs > {done} && window.explorer.last.image == 2")
    spec = browser.execute_script("return window.explorer.spec")
    assert spec == [{"kind": "NeuronAblation", "neurons": {"2": [17, 101, 402, 655]}, "mode": "zero"}]
    expected = session.run(2, spec)
    shown = torch.tensor(browser.execute_script("return window.explorer.last.norms"))
    assert torch.equal(shown, torch.tensor(expected["norms"]))
    assert browser.find_element("id", "outlier-base").text == str(expected["baseline"]["outlier_count"])


def test_bad_typed_neuron_shows_the_servers_message_and_the_page_recovers(browser):
    typed = browser.find_element("id", "typed")
    typed.clear()
    typed.send_keys("2:99999")
    browser.find_element("id", "typed-apply").click()
    wait_for(browser, "document.getElementById('status').dataset.errors >= 1")
    assert "neuron 99999" in browser.find_element("id", "error").text
    typed.clear()
    done = runs(browser)
    browser.find_element("id", "typed-apply").click()
    wait_for(browser, f"window.explorer.runs > {done}")
    assert not browser.find_element("id", "error").is_displayed()


def test_exported_patch_reproduces_the_pages_logits(browser, served):
    session, _ = served
    done = runs(browser)
    browser.find_element("id", "selcls").click()  # SelectiveCLS on top of the ablation
    wait_for(browser, f"window.explorer.runs > {done}")
    browser.find_element("id", "export").click()
    deadline = time.monotonic() + 600  # a safety net: the loop ends when the file is there
    path = Path(browser.downloads) / "explore-patch.safetensors"
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.is_file(), "the export was not downloaded"
    time.sleep(0.2)  # the download is renamed into place once complete
    page = browser.execute_script("return window.explorer.last")
    assert [iv.kind for iv in interp.patch.load(path)] == ["NeuronAblation", "SelectiveCLS"]
    plain = interp.patch.apply(interp.models.planted_vit(), path)
    with torch.no_grad():
        logits = plain(session.pixels[page["image"]:page["image"] + 1].cpu())[0]
    assert torch.allclose(logits, torch.tensor(page["logits"]), atol=1e-4)


def test_the_page_says_what_it_shows_in_words(browser, served):
    """The threshold, the edits and the CLS attention in words; every non-constant activation map shows
    structure (dense neurons were solid squares); the curve has an axis title and its grey band a legend."""
    session, _ = served
    wait_for(browser, "window.explorer && window.explorer.runs >= 1")
    text = lambda element_id: browser.find_element("id", element_id).text  # noqa: E731
    label = session.info()["threshold"].get("label")
    assert text("threshold-note") == f"threshold at block 5: {label}" and "auto (auto)" not in text("threshold-note")
    page = browser.execute_script("return window.explorer.last")
    assert text("edits") == page["edits"] and "[" not in text("edits")
    prefix = text("prefix")
    assert "Of the CLS token's attention (mean over heads)" in prefix and "e-" not in prefix, prefix
    for m in page["neuron_maps"]:
        key = f"{m['layer']}:{m['neuron']}"
        colours = browser.execute_script(
            "const cv = document.querySelector(`#neurons canvas[data-key='" + key + "']`);"
            "const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data, seen = new Set();"
            "for (let i = 0; i < d.length; i += 4) seen.add(d[i] + ',' + d[i + 1] + ',' + d[i + 2]);"
            "return Array.from(seen);")
        if min(m["map"]) < max(m["map"]):  # its own scale: its lowest cell white, its highest dark red
            assert "255,255,255" in colours and "103,0,13" in colours, (key, colours)
    svg = browser.find_element("id", "curves").get_attribute("innerHTML")
    assert "patch norm (log scale)" in svg and f"block {page['detect_layer']} (shown in the maps above)" in svg
