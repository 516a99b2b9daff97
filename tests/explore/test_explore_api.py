"""``interp explore``'s JSON API over a real server (uvicorn on 127.0.0.1, one per module): the access token,
the numbers against the studies' own (norms, ablation, test-time register), bad requests, patch export, the
Python entry point and the command line."""
from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import pytest
import torch
from forked import Forked
from forked import cli as forked_cli

pytest.importorskip("starlette", reason="the explore extra (pip install -e '.[explore]') is not installed")
pytest.importorskip("uvicorn", reason="the explore extra (pip install -e '.[explore]') is not installed")

import interp  # noqa: E402
from interp.explore.server import ExploreServer  # noqa: E402
from interp.explore.session import ExploreOptions, ExploreSession  # noqa: E402
from interp.studies.artifacts.ablate import ablate_study  # noqa: E402
from interp.studies.artifacts.norms import norms_study  # noqa: E402
from interp.studies.artifacts.registers import registers_study  # noqa: E402
from interp.runtime.open import open_source  # noqa: E402

from conftest import images as random_images, make_model  # noqa: E402
from interp.detection.spec import DetectionSpec
from interp.detection.detection import RunOptions

PLANTED = {"2": [17, 101, 402, 655]}
ABLATE = [{"kind": "NeuronAblation", "neurons": PLANTED}]


@pytest.fixture(scope="module")
def served():
    torch.manual_seed(0)
    model = interp.load("planted_vit")
    session = ExploreSession(model, interp.models.sample_image_paths())
    server = ExploreServer(session).start()
    yield session, server
    server.stop()


def request(server, path, body=None, token=True, raw=None, headers=None):
    """(status, parsed JSON or bytes) of one request; ``token``: True (header), False, or a string (query)."""
    url = f"http://127.0.0.1:{server.port}/{path}"
    hdrs = dict(headers or {})
    if token is True:
        hdrs["X-Interp-Token"] = server.token
    elif isinstance(token, str):
        url += ("&" if "?" in url else "?") + f"token={token}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=hdrs, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=600) as res:  # a safety net against a hung server only
            status, payload, kind = res.status, res.read(), res.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, payload, kind = e.code, e.read(), e.headers.get("Content-Type", "")
    return status, (json.loads(payload) if "json" in kind else payload)


def test_every_route_needs_the_token(served):
    _, server = served
    assert server.host == "127.0.0.1" and f"?token={server.token}" in server.url and len(server.token) >= 32
    for path, body in (("", None), ("api/info", None), ("static/app.js", None), ("api/image/0", None),
                       ("api/run", {"image": 0}), ("api/export", {"interventions": ABLATE}), ("nowhere", None)):
        status, answer = request(server, path, body, token=False)
        assert status == 401 and "access token" in answer["error"], path
        status, answer = request(server, path, body, token="wrong" + server.token)
        assert status == 403, path
    assert request(server, "", token=server.token)[0] == 200
    assert request(server, "api/info", headers={"Authorization": f"token {server.token}"}, token=False)[0] == 200


def test_page_and_assets_are_local(served):
    _, server = served
    status, html = request(server, "", token=server.token)
    assert status == 200 and b"<canvas" in html and server.token.encode() in html
    for name in ("app.js", "draw.js", "app.css"):
        status, body = request(server, f"static/{name}")
        assert status == 200 and b"http://" not in body and b"https://" not in body, name  # no CDN
    assert b"http://" not in html and b"https://" not in html
    assert request(server, "static/..%2Fsession.py")[0] == 404
    status, png = request(server, "api/image/1")
    assert status == 200 and png[:8] == b"\x89PNG\r\n\x1a\n"


def test_info_lists_images_neurons_and_readout(served):
    session, server = served
    status, info = request(server, "api/info")
    assert status == 200
    assert [im["id"] for im in info["images"]] == [str(p) for p in interp.models.sample_image_paths()]
    ranked = {(n["layer"], n["neuron"]) for n in info["neurons"]["list"][:4]}
    assert ranked == {(2, n) for n in PLANTED["2"]}  # the ranking computed on start finds the planted neurons
    assert info["readout"]["kind"] == "embedding" and "planted" in info["readout"]["why"]
    assert info["threshold"]["value"] == pytest.approx(session.detection.threshold.value)


def _one_image_source(session, i):
    return open_source(model=session.model, images=session.pixels[i:i + 1].cpu())


def test_unedited_numbers_equal_the_norms_study(served):
    session, server = served
    det = session.detection.layer
    for i in range(len(session.source)):
        status, r = request(server, "api/run", {"image": i, "interventions": []})
        assert status == 200
        norms = torch.tensor(r["norms"])  # [blocks, patches]
        assert norms.shape == (session.model.n_layers, session.layout.n_patches)
        # one image here, batches of several in the detection: other BLAS kernels sum in another order. A K-term
        # float32 dot product is off by at most K * eps of its largest terms (Higham's gamma_K), once per block,
        # so the bound is relative to the image's largest norm (K: the MLP width, the longest sum)
        tol = session.model.n_layers * session.model.d_mlp * torch.finfo(torch.float32).eps \
            * float(session.detection.norms[i].max())
        assert torch.allclose(norms[det], session.detection.norms[i], rtol=0, atol=tol)
        study = norms_study(_one_image_source(session, i), detection=DetectionSpec(threshold=r["threshold"]), progress=False)
        assert r["outlier_count"] == study.outlier_counts[0] == r["baseline"]["outlier_count"]
        for stage in ("resid_mid", "resid_post"):
            assert r["curves"][stage]["max"] == pytest.approx(study.max_patch_norm[stage], rel=1e-5)
            assert r["curves"][stage]["median"] == pytest.approx(
                study.emergence_curves["median_patch_norm"][stage], rel=1e-5)
        assert r["threshold"] == pytest.approx(session.detection.threshold.value)


def test_edited_numbers_equal_the_ablation_and_register_studies(served):
    session, server = served
    source = open_source(model=session.model, images=session.pixels.cpu())
    found = interp.detection.detection.detect(source, DetectionSpec(threshold="auto"), RunOptions(progress=False))
    neurons = {2: PLANTED["2"]}
    ablated = ablate_study(source, neurons=neurons, controls=0, detection=found, progress=False)
    ttr = registers_study(source, neurons=neurons, detection=found, progress=False)
    runs = {name: [request(server, "api/run", {"image": i, "interventions": spec})[1] for i in range(len(source))]
            for name, spec in (("ablate", ABLATE), ("ttr", [{"kind": "TestTimeRegister", "neurons": PLANTED}]),
                               ("none", []))}
    det = found.layer
    assert sum(r["outlier_count"] for r in runs["none"]) == ablated.conditions["baseline"]["outlier_count"] > 0
    assert sum(r["outlier_count"] for r in runs["ablate"]) == ablated.conditions["target"]["outlier_count"] == 0
    assert max(max(r["norms"][det]) for r in runs["ablate"]) == pytest.approx(
        ablated.conditions["target"]["max_norm"], rel=1e-5)
    assert sum(r["outlier_count"] for r in runs["ttr"]) == ttr.with_register["outlier_count"]
    assert max(max(r["norms"][det]) for r in runs["ttr"]) == pytest.approx(ttr.with_register["max_patch_norm"],
                                                                          rel=1e-5)
    assert runs["ttr"][0]["prefix_labels"] == ["CLS", "test-time register 0"]
    # the maps changed with the edit, and the ablated neurons' maps are zero
    assert runs["ablate"][0]["norms"] != runs["none"][0]["norms"]
    maps = {(m["layer"], m["neuron"]): m["map"] for m in runs["ablate"][0]["neuron_maps"]}
    assert all(not any(maps[(2, n)]) for n in PLANTED["2"])
    # not a classifier: the readout is the cosine of the pooled vectors, computed here directly
    with session.model.intervene(*session.interventions(ABLATE)):
        _, cache = session.model.run_with_cache(session.pixels, names_filter="hook_pooled")
    _, base = session.model.run_with_cache(session.pixels, names_filter="hook_pooled")
    cos = torch.nn.functional.cosine_similarity(cache["hook_pooled"].double(), base["hook_pooled"].double(), dim=-1)
    assert runs["ablate"][0]["readout"]["kind"] == "embedding"
    assert runs["ablate"][0]["readout"]["value"] == pytest.approx(float(cos.mean()), rel=1e-6)


def test_classifier_readout_equals_the_ablation_studys_agreement(one_thread):
    model = make_model("vit", seed=1)
    x = random_images(6, seed=3)
    session = ExploreSession(model, x, ExploreOptions(detection=DetectionSpec(threshold="p99")))  # a 1000-class head: class logits
    neurons = {0: list(range(0, 1536, 3)), 1: list(range(1, 1536, 2))}  # enough to move some argmaxes
    spec = [{"kind": "NeuronAblation", "neurons": {str(k): v for k, v in neurons.items()}}]
    r = session.run(2, spec)
    study = ablate_study(open_source(model=model, images=x), detection=DetectionSpec(threshold="p99"), neurons=neurons, controls=0,
                         progress=False)
    assert r["readout"]["kind"] == "classifier"
    assert r["readout"]["value"] == pytest.approx(study.conditions["target"]["top1_agreement"])
    assert r["readout"]["value"] < 1.0  # the edit moved something: the test can tell agreement from 1
    assert session.run(2, [])["readout"]["value"] == 1.0


@pytest.mark.parametrize("body, status, words", [
    ({"image": 99, "interventions": []}, 404, "unknown image 99"),
    ({"image": -1}, 404, "unknown image -1"),
    ({"image": "0"}, 404, "unknown image '0'"),
    ({"interventions": []}, 400, "missing 'image'"),
    ({"image": 0, "interventions": [{"kind": "NeuronAblation", "neurons": {"2": [9999]}}]}, 400, "neuron 9999"),
    ({"image": 0, "interventions": [{"kind": "NeuronAblation", "neurons": {"40": [1]}}]}, 400, "layer 40"),
    ({"image": 0, "interventions": [{"kind": "Nope"}]}, 400, "unknown intervention kind"),
    ({"image": 0, "interventions": {"kind": "NeuronAblation"}}, 400, "must be a list"),
    ({"image": 0, "interventions": [{"kind": "Relocation", "neurons": PLANTED, "target": [[1, 0], [0, 1]]}]},
     400, "patch grid"),
    ({"image": 0, "threshold": "high"}, 400, "threshold"),
    ({"image": 0, "colour": "red"}, 400, "unknown field"),
])
def test_bad_requests_get_a_4xx_and_the_server_keeps_running(served, body, status, words):
    _, server = served
    got, answer = request(server, "api/run", body)
    assert got == status and words in answer["error"], answer
    assert request(server, "api/run", {"image": 0, "interventions": ABLATE})[1]["outlier_count"] == 0


def test_malformed_json_is_a_400(served):
    _, server = served
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        status, answer = request(server, "api/run", raw=raw)
        assert status == 400 and ("JSON" in answer["error"]), answer
    assert request(server, "api/info")[0] == 200


def test_exported_patch_gives_a_plain_timm_model_the_edited_logits(served, tmp_path):
    session, server = served
    spec = [{"kind": "NeuronAblation", "neurons": PLANTED, "mode": "mean"}, {"kind": "SelectiveCLS", "k": 2}]
    status, blob = request(server, "api/export", {"interventions": spec})
    assert status == 200 and isinstance(blob, bytes)
    path = tmp_path / "edit.safetensors"
    path.write_bytes(blob)
    assert [iv.kind for iv in interp.patch.load(path)] == ["NeuronAblation", "SelectiveCLS"]
    plain = interp.patch.apply(interp.models.planted_vit(), path)
    page = request(server, "api/run", {"image": 1, "interventions": spec})[1]
    with torch.no_grad():
        logits = plain(session.pixels[1:2].cpu())[0]
    assert torch.allclose(logits, torch.tensor(page["logits"]), atol=1e-4)
    assert not torch.allclose(logits, torch.tensor(request(server, "api/run", {"image": 1})[1]["logits"]), atol=1e-3)
    status, answer = request(server, "api/export", {"interventions": []})
    assert status == 400 and "no edits" in answer["error"]


def test_resample_gives_the_shown_image_the_next_images_values(served):
    """The explorer's resample ablation on image 0 equals the study's edit on the batch [image 0, image 1]."""
    session, server = served
    spec = [{"kind": "NeuronAblation", "neurons": PLANTED, "mode": "resample"}]
    page = request(server, "api/run", {"image": 0, "interventions": spec})[1]
    edit = interp.interventions.NeuronAblation({int(l): n for l, n in PLANTED.items()}, mode="resample")
    with torch.no_grad():
        expected = session.model.run_with_interventions(session.pixels[[0, 1]], [edit])[0].float().cpu()
    assert torch.allclose(torch.tensor(page["logits"]), expected, atol=1e-4)
    zero = request(server, "api/run", {"image": 0, "interventions": [{**spec[0], "mode": "zero"}]})[1]
    assert not torch.allclose(torch.tensor(page["logits"]), torch.tensor(zero["logits"]), atol=1e-4)
    assert "readout" in page


def test_python_entry_point_serves_and_stops(one_thread):
    with pytest.warns(UserWarning, match="listens on 127.0.0.2"):  # not 127.0.0.1: said out loud
        ex = interp.explore.start(make_model("vit", depth=1), random_images(2),
                                  detection=DetectionSpec(threshold="p99"), host="127.0.0.2")
    try:
        assert ex.running and ex.url.startswith("http://127.0.0.2:")
        assert f'src="{ex.url}"' in ex._repr_html_()
        with urllib.request.urlopen(ex.url, timeout=600) as res:
            assert res.status == 200
        assert ex.run(1)["image"] == 1
    finally:
        ex.stop()
    assert not ex.running and "stopped" in ex._repr_html_()
    with pytest.raises(OSError):
        urllib.request.urlopen(ex.url, timeout=5)


def test_cli_prints_a_token_url_and_serves(tmp_path):
    with Forked(forked_cli, "explore", "--no-open", "--no-progress", "--neurons", "2:17,2:101", capture=True) as proc:
        url = None
        while url is None:
            line = proc.stderr.readline()  # blocks until the server prints a line, "" once it has ended
            if not line:
                break
            if "?token=" in line:
                url = line.strip()
        assert url and url.startswith("http://127.0.0.1:"), "no URL printed"
        with urllib.request.urlopen(url.replace("/?", "/api/info?"), timeout=600) as res:
            info = json.loads(res.read())
        assert info["model"] == "planted_vit" and len(info["images"]) == 4
        assert [(n["layer"], n["neuron"]) for n in info["neurons"]["list"]] == [(2, 17), (2, 101)]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url.split("?")[0] + "api/info", timeout=600)
        assert e.value.code == 401
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate()
    assert proc.returncode == 0 and "stopped" in err, err


@pytest.mark.parametrize("argv, words, status", [  # status 2: refused while parsing, as argparse does
    (["--port", "70000"], "--port: expected a port 0..65535", 2),
    (["--neurons", "2:x"], "cannot read '2:x'", 1),
    (["--threshold", "p200"], "pNN with 0 < NN < 100", 2),
    (["--weights", __file__], "--weights needs a MODEL", 1),
    (["--top-k", "0"], "--top-k: expected a whole number >= 1", 2),
    (["--images", "interp/data/samples", "--max-images", "2"], "4 images: the explorer holds its images", 1),
    (["--images", "no/such/folder"], "does not exist", 2),
])
def test_cli_bad_arguments_are_one_line(argv, words, status, capsys):
    from interp.cli import main

    assert main(["explore", "--no-open", *argv]) == status
    err = capsys.readouterr().err  # the error is the last line (a "preparing" status line may come first)
    assert err.splitlines()[-1].startswith("interp: error:") and words in err and "Traceback" not in err


def test_neurons_named_by_a_file_are_refused_before_any_read(served, tmp_path, monkeypatch):
    import interp.interventions.neuron_sets as neuron_sets

    _, server = served
    path = tmp_path / "neurons.json"
    path.write_text(json.dumps({"model": "planted_vit", "neurons": [{"layer": 2, "neuron": 777}]}))
    opened = []
    monkeypatch.setattr(neuron_sets, "read_neurons_json", lambda p: opened.append(p))
    for route, body in (("api/run", {"image": 0}), ("api/export", {})):
        for given in (str(path), str(tmp_path)):
            body = {**body, "interventions": [{"kind": "NeuronAblation", "neurons": given}]}
            status, answer = request(server, route, body)
            assert status == 400 and "reads no files" in answer["error"] and "777" not in answer["error"], answer
    assert opened == []
    ok = request(server, "api/run", {"image": 0, "interventions": [{"kind": "NeuronAblation", "neurons": "2:17"}]})
    assert ok[0] == 200


def test_parsed_edits_and_readouts_are_bounded(served, monkeypatch):
    import interp.explore.display as session_module  # where the bound of the caches is

    session, _ = served
    monkeypatch.setattr(session_module, "CACHE_SIZE", 3)
    for n in range(6):
        session.run(0, [{"kind": "NeuronAblation", "neurons": {"2": [n]}}])
    assert len(session._parsed) <= 3 and len(session._readouts) <= 3 and len(session._runs) <= 3
    assert _edit_key_of({"2": [5]}) in session._parsed  # the most recent kept


def _edit_key_of(neurons):
    from interp.explore.display import edit_key

    return edit_key([{"kind": "NeuronAblation", "neurons": neurons}])


def test_export_saves_under_the_session_lock(served, monkeypatch):
    import interp.interventions.export as patch

    session, _ = served
    held, save = [], patch.save
    monkeypatch.setattr(patch, "save", lambda *a, **k: held.append(session.lock._is_owned()) or save(*a, **k))
    assert session.export(ABLATE)
    assert held == [True]


def test_folder_labels_give_accuracy_only_when_they_name_the_models_classes(one_thread, tmp_path):
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for i in range(2):
            pixels = (torch.rand(32, 32, 3, generator=gen) * 255).byte().numpy()
            Image.fromarray(pixels).save(tmp_path / c / f"{i}.png")
    model = make_model("vit", depth=1)
    options = ExploreOptions(detection=DetectionSpec(threshold="p99"))
    ro = ExploreSession(model, tmp_path, options).run(0)["readout"]
    assert ro["accuracy"] is None and "folder names do not match the classifier's class names" in ro["accuracy_note"]
    names = [f"class {i}" for i in range(model.timm_model.num_classes)]
    names[7], names[3] = "cat", "Dog"
    model.timm_model.pretrained_cfg = {**model.timm_model.pretrained_cfg, "label_names": names}
    session = ExploreSession(model, tmp_path, options)
    ro = session.run(0)["readout"]
    top1 = session.baseline_outputs["logits"].argmax(-1)
    expected = float((top1 == torch.tensor([7, 7, 3, 3])).double().mean())
    assert ro["accuracy"] == pytest.approx(expected) and ro["accuracy_note"] is None


def test_a_server_that_does_not_start_or_never_served_releases_its_socket(served):
    session, _ = served
    never = ExploreServer(session)
    never.stop()
    assert never.socket.fileno() == -1
    stuck = ExploreServer(session)

    def hang(sockets):  # never reports started; ends when told to exit
        while not stuck.server.should_exit:
            time.sleep(0.01)

    stuck.server.run = hang
    thread_of = []
    with pytest.raises(interp.InterpError, match="did not start"):
        original = stuck.stop
        stuck.stop = lambda: (thread_of.append(stuck.thread), original())[1]
        stuck.start(timeout=0.2)
    assert thread_of and not thread_of[0].is_alive() and stuck.socket.fileno() == -1


def test_cli_closes_its_server_when_serving_fails(monkeypatch, capsys):
    import interp.explore.server as server_module
    from interp.cli import main

    made = []

    class Failing(server_module.ExploreServer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

        def serve(self):
            raise RuntimeError("boom")

    monkeypatch.setattr(server_module, "ExploreServer", Failing)
    with pytest.raises(RuntimeError):
        main(["explore", "--no-open", "--no-progress", "--neurons", "2:17"])
    assert made and made[0].socket.fileno() == -1
