"""``interp explore``: time of one toggle (an edit not seen before, so the edited forward really re-runs) on the
bundled ``planted_vit`` and one image, on this CPU.

* server time: the ``seconds`` that ``POST /api/run`` reports (edited forward of the image with every block's
  norms, CLS attention and neuron maps, plus the readout's edited forward over all loaded images), and the
  HTTP round trip around it;
* browser-observed time: in headless chromium (Selenium, Debian's chromium-driver), from the page's fetch to
  the maps redrawn (``performance.now()`` in the page), for clicks on the neuron check boxes and the edit radios;
* set-up (once per session): decoding, the detection, the neuron ranking and the unedited outputs.

    python benchmarks/explore.py [--rounds 12] [--threads 2]   -> results/explore.json

Target: every toggle under 1 s, server and browser.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interp  # noqa: E402
from common import write_results  # noqa: E402
from interp.explore.server import ExploreServer  # noqa: E402
from interp.explore.session import ExploreSession  # noqa: E402

TARGET_S = 1.0


def post(server, body) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/api/run", data=json.dumps(body).encode(),
                                 headers={"X-Interp-Token": server.token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as res:
        return json.loads(res.read())


def api_toggles(server, session, rounds: int) -> dict:
    """Distinct neuron sets (one more neuron per round), each new to the session's caches."""
    ranked = [(n["layer"], n["neuron"]) for n in session.neurons] or [(0, 0)]
    server_s, wall_s = [], []
    for r in range(rounds):
        layer, _ = ranked[0]
        neurons = sorted({n for l, n in ranked if l == layer} | {700 + r % 60, r})  # new every round
        body = {"image": r % len(session.source),
                "interventions": [{"kind": "NeuronAblation", "neurons": {str(layer): neurons}}]}
        start = time.perf_counter()
        out = post(server, body)
        wall_s.append(time.perf_counter() - start)
        assert not out["cached"]
        server_s.append(out["seconds"])
    kinds = {}
    for name, spec in (("TestTimeRegister", [{"kind": "TestTimeRegister", "neurons": {"2": [17, 101, 402, 655]}}]),
                       ("Relocation", [{"kind": "Relocation", "neurons": {"2": [17, 101, 402, 655]},
                                        "target": "smiley"}]),
                       ("SelectiveCLS", [{"kind": "SelectiveCLS", "k": 3}]),
                       ("NeuronAblation mean", [{"kind": "NeuronAblation", "neurons": {"2": [17, 101]},
                                                 "mode": "mean"}])):
        kinds[name] = post(server, {"image": 0, "interventions": spec})["seconds"]
    return {"server_s": server_s, "round_trip_s": wall_s, "per_kind_server_s": kinds}


def browser_toggles(server) -> dict:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='explore-bench-')}", "--window-size=1400,1100"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    try:
        driver.get(server.url)

        def after(action) -> float:
            done = driver.execute_script("return window.explorer.runs")
            action()
            deadline = time.monotonic() + 30
            while driver.execute_script("return window.explorer.runs") <= done:
                if time.monotonic() > deadline:
                    raise RuntimeError("the page did not update")
                time.sleep(0.01)
            return driver.execute_script("return window.explorer.browserMs") / 1000

        deadline = time.monotonic() + 60
        while not driver.execute_script("return window.explorer && window.explorer.runs >= 1"):
            if time.monotonic() > deadline:
                raise RuntimeError("the page did not load")
            time.sleep(0.05)
        clicks = []
        for box in driver.find_elements("css selector", "#neurons input.neuron"):
            clicks.append(after(box.click))
        radios = [after(driver.find_element("css selector", f'input[name="edit"][value="{v}"]').click)
                  for v in ("register", "relocate", "ablate")]
        image = after(driver.find_element("css selector", '#thumbs img[data-index="1"]').click)
        return {"neuron_clicks_s": clicks, "edit_radio_s": radios, "other_image_s": image}
    finally:
        driver.quit()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    session = ExploreSession(interp.load("planted_vit"), interp.models.sample_image_paths())
    setup_s = time.perf_counter() - start
    server = ExploreServer(session).start()
    try:
        api = api_toggles(server, session, args.rounds)
        browser = None if args.no_browser else browser_toggles(server)
    finally:
        server.stop()
    summary = {"setup_s": setup_s, "server_median_s": statistics.median(api["server_s"]),
               "server_max_s": max(api["server_s"]), "round_trip_median_s": statistics.median(api["round_trip_s"])}
    if browser:
        clicks = browser["neuron_clicks_s"] + browser["edit_radio_s"]
        summary.update(browser_median_s=statistics.median(clicks), browser_max_s=max(clicks))
    summary["under_target"] = all(v < TARGET_S for k, v in summary.items() if k.endswith("max_s"))
    path = write_results("explore", {"model": "planted_vit", "images": len(session.source), "target_s": TARGET_S,
                                     "summary": summary, "api": api, "browser": browser})
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
