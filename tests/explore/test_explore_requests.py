"""``interp explore``: bounded and exact requests, in process (Starlette's TestClient) where no socket is
needed: integer indices only, at most MAX_INTERVENTIONS per request, a time limit per request, finite
thresholds, a bounded body, the Host check; on a real server: idle connections closed, a client that goes
away logged in one line."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import pytest
import torch

pytest.importorskip("starlette", reason="the explore extra (pip install -e '.[explore]') is not installed")
pytest.importorskip("uvicorn", reason="the explore extra (pip install -e '.[explore]') is not installed")

from starlette.testclient import TestClient  # noqa: E402

import interp  # noqa: E402
from interp.explore.server import MAX_BODY, ExploreServer, build_app  # noqa: E402
from interp.explore.session import ExploreSession  # noqa: E402

TOKEN = "t" * 48
PLANTED = {"2": [17, 101, 402, 655]}
ABLATE = [{"kind": "NeuronAblation", "neurons": PLANTED}]


@pytest.fixture(scope="module")
def session():
    torch.manual_seed(0)
    return ExploreSession(interp.load("planted_vit"), interp.models.sample_image_paths())


@pytest.fixture(scope="module")
def client(session):
    with TestClient(build_app(session, TOKEN), base_url="http://127.0.0.1:8765",
                    headers={"X-Interp-Token": TOKEN}, raise_server_exceptions=False) as c:
        yield c


def post(client, route, body=None, raw=None, **kwargs):
    data = raw if raw is not None else json.dumps(body)
    res = client.post(route, content=data, headers={"Content-Type": "application/json", **kwargs})
    return res.status_code, res.json() if "json" in res.headers.get("content-type", "") else res.content


def one_line(answer) -> str:
    error = answer["error"]
    assert "\n" not in error and "Traceback" not in error
    return error


@pytest.mark.parametrize("neurons, shown", [
    ({"2": [1.5]}, "1.5 (a float)"),        # ran as neuron 1
    ({"2": [True]}, "True (a boolean)"),    # ran as neuron 1
    ({"2": ["17"]}, "'17' (a string)"),      # ran as neuron 17
    ({"2": [17.0]}, "17.0 (a float)"),
    ({"2": [17, 101.0]}, "101.0 (a float)"),
])
def test_neuron_indices_must_be_json_integers(client, neurons, shown):
    for route, body in (("/api/run", {"image": 0}), ("/api/export", {})):
        status, answer = post(client, route, {**body, "interventions": [{"kind": "NeuronAblation",
                                                                         "neurons": neurons}]})
        assert status == 400, (route, answer)
        assert "must be JSON integers" in one_line(answer) and shown in answer["error"], answer
    assert post(client, "/api/run", {"image": 0, "interventions": ABLATE})[1]["outlier_count"] == 0


@pytest.mark.parametrize("entry, words", [
    ({"kind": "NeuronAblation", "neurons": {"2.0": [17]}}, "layer '2.0'"),
    ({"kind": "NeuronAblation", "neurons": {"2": 17}}, "must be a list"),
    ({"kind": "SelectiveCLS", "k": 1.5}, "'k' must be JSON integers"),
    ({"kind": "SelectiveCLS", "k": True}, "'k' must be JSON integers"),
    ({"kind": "TestTimeRegister", "neurons": PLANTED, "n_registers": 1.0}, "'n_registers' must be"),
    ({"kind": "Relocation", "neurons": PLANTED, "target": {"indices": [0, 1.5]}}, "target cells must be"),
    ({"kind": "Relocation", "neurons": PLANTED, "target": {"box": [0, 0, True, 2]}}, "target cells must be"),
    ({"kind": "Relocation", "neurons": PLANTED, "target": [[0.5] * 14] * 14}, "0 or 1 per cell"),
    ({"kind": "SAEFeatureAblation", "features": "58"}, "'features' must be a JSON list"),  # ran as [5, 8]
    ({"kind": "SAEFeatureAblation", "features": "12"}, "not a string ('12')"),  # ran as [1, 2]
    ({"kind": "SAEFeatureAblation", "features": {"58": 1}}, "not an object"),  # ran as [58]
    ({"kind": "SAEFeatureAblation", "features": 58}, "not an integer"),
])
def test_other_indices_are_exact_too(client, entry, words):
    status, answer = post(client, "/api/run", {"image": 0, "interventions": [entry]})
    assert status == 400 and words in one_line(answer), answer


def test_export_refuses_feature_ids_it_would_coerce(client):
    """/api/export wrote features [5, 8] for "58"."""
    for features in ("58", {"58": 1}):
        status, answer = post(client, "/api/export", {"interventions": [{"kind": "SAEFeatureAblation",
                                                                          "features": features}]})
        assert status == 400 and "must be a JSON list" in one_line(answer), answer


def test_test_time_register_tokens_per_request_are_capped(client):
    """16 test-time registers of 1024 tokens each took the explorer past 7 GB."""
    from interp.explore.requests import MAX_REGISTER_TOKENS

    many = [{"kind": "TestTimeRegister", "neurons": PLANTED, "n_registers": 1024}] * 16
    status, answer = post(client, "/api/run", {"image": 0, "interventions": many})
    assert status == 413 and f"at most {MAX_REGISTER_TOKENS}" in one_line(answer), answer
    status, answer = post(client, "/api/run", {"image": 0, "interventions": [
        {"kind": "SAEFeatureAblation", "features": list(range(5000))}]})
    assert status == 413 and "5000 features" in one_line(answer), answer


def test_the_number_of_interventions_is_capped(client):
    from interp.explore.requests import MAX_INTERVENTIONS

    many = [{"kind": "NeuronAblation", "neurons": {"2": [17]}}] * (MAX_INTERVENTIONS + 1)
    for route, body in (("/api/run", {"image": 0}), ("/api/export", {})):
        status, answer = post(client, route, {**body, "interventions": many})
        assert status == 413 and f"at most {MAX_INTERVENTIONS}" in one_line(answer), answer
    status, _ = post(client, "/api/run", {"image": 0, "interventions": many[:MAX_INTERVENTIONS]})
    assert status == 200


def test_a_request_over_the_time_limit_is_stopped_and_leaves_the_model_unedited(client, session, monkeypatch):
    now = [0.0]

    def clock():  # every reading is 1000 s later: any model work is over the limit
        now[0] += 1000.0
        return now[0]

    unedited = session.run(1)["norms"]
    edits = [[{"kind": "NeuronAblation", "neurons": {"3": [5]}}],
             [{"kind": "NeuronAblation", "neurons": {"3": [6]}, "mode": "mean"}],  # stopped in calibration
             [{"kind": "TestTimeRegister", "neurons": {"3": [7]}}]]
    monkeypatch.setattr(session, "clock", clock)
    for spec in edits:
        status, answer = post(client, "/api/run", {"image": 1, "interventions": spec})
        assert status == 413 and "limit of 600 s" in one_line(answer) and "--max-seconds" in answer["error"]
    status, answer = post(client, "/api/export", {"interventions": edits[1]})
    assert status == 413, answer
    monkeypatch.setattr(session, "clock", time.monotonic)
    again = post(client, "/api/run", {"image": 1, "interventions": []})[1]
    assert again["norms"] == unedited  # nothing of the stopped edits stayed on the model
    assert post(client, "/api/run", {"image": 1, "interventions": edits[0]})[0] == 200  # nothing cached wrong


@pytest.mark.parametrize("raw", [b'{"image": 0, "threshold": Infinity}', b'{"image": 0, "threshold": -Infinity}',
                                 b'{"image": 0, "threshold": NaN}', b'{"image": 0, "threshold": 1' + b"0" * 400 + b"}",
                                 b'{"image": 0, "threshold": 0}', b'{"image": 0, "threshold": -3}'])
def test_thresholds_must_be_finite_norms(client, raw):
    status, answer = post(client, "/api/run", raw=raw)
    assert status == 400 and ("finite" in one_line(answer)), answer


def test_a_threshold_above_every_norm_means_no_outliers(client, session):
    status, answer = post(client, "/api/run", {"image": 0, "threshold": 1e308})
    assert status == 200 and answer["outlier_count"] == 0 and answer["baseline"]["outlier_count"] == 0
    with pytest.raises(interp.InterpError, match="finite norm"):
        session.run(0, [], float("inf"))


def test_python_callers_cannot_pass_inf_either(session):
    with pytest.raises(interp.InterpError, match="finite"):
        session.run(0, [{"kind": "TestTimeRegister", "neurons": PLANTED, "value": float("nan")}])


def test_the_body_is_bounded_before_it_is_read(client):
    status, answer = post(client, "/api/run", raw=b"{}", **{"Content-Length": str(MAX_BODY + 1)})
    assert status == 413 and "MiB" in one_line(answer)
    deep = b"[" * 100_000 + b"]" * 100_000
    status, answer = post(client, "/api/run", raw=deep)
    assert status == 400 and "nested too deeply" in one_line(answer), answer


@pytest.mark.parametrize("host, ok", [("127.0.0.1:8765", True), ("localhost:8765", True), ("[::1]:8765", True),
                                      ("attacker.example:8765", False), ("127.0.0.1.nip.io:8765", False),
                                      ("", False)])
def test_requests_for_another_host_are_refused(client, host, ok):
    res = client.get("/api/info", headers={"Host": host})
    assert (res.status_code == 200) == ok, (host, res.status_code)
    if not ok:
        assert res.status_code == 400 and "answers only requests for 127.0.0.1" in one_line(res.json())


def test_a_wildcard_address_accepts_ip_addresses_and_this_machines_name():
    from interp.explore.connections import host_allowed

    assert host_allowed("192.168.1.20:8765", "0.0.0.0") and host_allowed(f"{socket.gethostname()}:1", "::")
    assert not host_allowed("attacker.example", "0.0.0.0")
    assert not host_allowed("192.168.1.20:8765", "192.168.1.21") and host_allowed("192.168.1.21", "192.168.1.21")


def _post_scope(path="/api/run"):
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1:8765"), (b"x-interp-token", TOKEN.encode()),
                         (b"content-type", b"application/json"), (b"content-length", b"100")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8765)}


def test_a_client_that_leaves_mid_request_is_one_log_line(session, caplog):
    app, scope = build_app(session, TOKEN), _post_scope()
    messages = [{"type": "http.request", "body": b'{"image": 0, ', "more_body": True}, {"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0)

    async def send(message):
        pass

    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        asyncio.run(app(scope, receive, send))  # raised ClientDisconnect before
    lines = [r for r in caplog.records if r.name == "uvicorn.error"]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "closed the connection during POST /api/run" in lines[0].getMessage()


def test_a_body_that_does_not_arrive_is_refused(session, monkeypatch):
    import interp.explore.server as server_module

    monkeypatch.setattr(server_module, "BODY_SECONDS", 0.01)
    sent = []

    async def receive():  # the client sends its head, then nothing
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(build_app(session, TOKEN)(_post_scope(), receive, send))
    assert sent[0]["status"] == 408 and b"did not arrive within" in sent[1]["body"]


@pytest.fixture(scope="module")
def served(session):
    server = ExploreServer(session, idle_seconds=0.3).start()
    yield server
    server.stop()


def _closed_by_server(sock, timeout=600.0) -> bool:
    """Whether the server closes ``sock`` (reads until EOF); ``timeout`` is a safety net against a hang only."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return False
    return True


@pytest.mark.parametrize("sent", [b"", b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # silent; half a head
                                  b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Interp-Token: " + TOKEN.encode()
                                  + b"\r\n\r\n"])  # a whole request, then nothing (keep-alive)
def test_idle_connections_are_closed(served, sent):
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(sent)
        assert _closed_by_server(sock)


def test_a_disconnect_on_the_real_server_logs_no_traceback(served):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(b"POST /api/run HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\nX-Interp-Token: " + served.token.encode() + b"\r\n\r\n{\"image\"")
            time.sleep(0.2)  # let the server start reading the body
        deadline = time.monotonic() + 600  # a safety net only: the line comes within the server's read
        while not records and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        logger.removeHandler(handler)
    assert records and all(r.exc_info is None for r in records), [r.getMessage() for r in records]
    assert "closed the connection" in records[0].getMessage()
