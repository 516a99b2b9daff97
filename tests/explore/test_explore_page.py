"""``interp explore``'s page and messages, without a browser: the threshold and the edits in words, the
page's explanations (the colour scale of the activation maps), the command's output streams and its --help
(the request limits). The drawn page itself: tests/explore/test_explore_browser.py."""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("starlette", reason="the explore extra (pip install -e '.[explore]') is not installed")

import interp  # noqa: E402
from interp.detection.spec import DetectionSpec  # noqa: E402
from interp.explore.session import ExploreOptions, ExploreSession  # noqa: E402
from interp.explore.server import STATIC_DIR  # noqa: E402

from conftest import images as random_images, make_model  # noqa: E402


@pytest.fixture(scope="module")
def planted():
    torch.manual_seed(0)
    return ExploreSession(interp.load("planted_vit"), interp.models.sample_image_paths())


def test_the_threshold_is_labelled_in_words(planted, one_thread):
    label = planted.info()["threshold"]["label"]
    assert re.fullmatch(r"\d+ \(auto: two-mode fit\)", label), label  # was "auto (auto) = 352"
    assert label.startswith(f"{planted.default_threshold:.0f} ")
    model = make_model("vit", depth=1)

    def label_under(detection):
        session = ExploreSession(model, random_images(2), ExploreOptions(detection=detection))
        return session.info()["threshold"]["label"], session.detection.preset

    p99 = label_under(DetectionSpec(threshold="p99"))
    assert p99 == (p99[0], None) and p99[0].endswith("(p99: percentile of the patch norms)"), p99
    assert label_under(DetectionSpec(threshold=5.0)) == ("5 (fixed)", None)
    assert label_under(DetectionSpec(preset="darcet")) == ("150 (fixed)", "darcet")  # the preset's, said as such


def test_the_edits_are_said_in_words(planted):
    from interp.explore.requests import describe_edits

    assert planted.run(0)["edits"] == "none"
    spec = [{"kind": "NeuronAblation", "neurons": {"2": [17, 101]}, "mode": "mean"}, {"kind": "SelectiveCLS", "k": 2}]
    assert planted.run(0, spec)["edits"] == "ablate (mean) 2:17, 2:101; SelectiveCLS k=2"
    drawn = [[0] * 14 for _ in range(14)]
    drawn[3][4] = drawn[5][6] = 1
    assert describe_edits([{"kind": "Relocation", "neurons": "2:17", "target": drawn}]) == \
        "relocate 2:17 onto 2 drawn cells"
    assert describe_edits([{"kind": "TestTimeRegister", "neurons": {"2": [17]}}]) == "test-time register from 2:17"


def test_the_page_shows_words_not_raw_json_and_explains_its_colours():
    html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    app = (STATIC_DIR / "app.js").read_text(encoding="utf-8")
    draw = (STATIC_DIR / "draw.js").read_text(encoding="utf-8")
    assert "edits-json" not in html and "JSON.stringify(spec" not in app  # the raw [] is gone
    assert "each map on its own scale" in html and "white (its lowest value) to dark red" in html
    assert "-top, top" not in app  # dense neurons' maps were one solid colour on a symmetric +-max scale
    assert "patch norm (log scale)" in draw and "(shown in the maps above)" in draw  # the curve's axis and band
    assert "(head mean) on them" not in app and "negligible" in draw


def _run_cli(monkeypatch, capsys, *flags):
    import interp.explore.server as server_module
    from interp.cli import main

    monkeypatch.setattr(server_module.ExploreServer, "serve", lambda self: None)  # start, print, return
    assert main(["explore", "--no-open", "--neurons", "2:17", *flags]) == 0  # no bars: stderr is not a terminal
    return capsys.readouterr()


def test_the_command_writes_its_status_and_url_to_stderr_only(monkeypatch, capsys):
    out = _run_cli(monkeypatch, capsys)
    assert out.out == ""  # "preparing..." was on stdout, the URL on stderr
    assert "interp explore: preparing planted_vit" in out.err and "?token=" in out.err and "stopped" in out.err
    for flag in ("--quiet", "--no-progress"):  # as interp report's stage lines
        quiet = _run_cli(monkeypatch, capsys, flag)
        assert quiet.out == "" and "preparing" not in quiet.err and "?token=" in quiet.err  # the URL: the result


def test_help_states_the_request_limits(capsys):
    from interp.cli import main
    from interp.commands import explore as command
    from interp.explore import connections, requests, server

    assert main(["explore", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-seconds" in text and f"at most {requests.MAX_INTERVENTIONS} interventions" in text
    # the torch-free --help repeats the limits the server enforces: they must agree
    assert command.MAX_SECONDS == requests.MAX_SECONDS
    assert f"{server.MAX_BODY // 2 ** 20} MiB" in command.LIMITS and f"{connections.IDLE_SECONDS:g} s" in command.LIMITS
