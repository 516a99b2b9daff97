"""The explorer's web server: a Starlette app over one :class:`~interp.explore.session.ExploreSession`, served by
uvicorn on 127.0.0.1 (another host only when asked), every request checked against a random access token.

Routes (all need the token: ``?token=...``, header ``X-Interp-Token: ...`` or ``Authorization: token ...``):

* ``GET /`` the page; ``GET /static/app.js|draw.js|app.css`` its assets (shipped in the package: no CDN);
* ``GET /api/info`` model, images, sizes, threshold, neurons; ``GET /api/image/{i}`` image i as the model sees it;
* ``POST /api/run`` ``{"image": i, "interventions": [...], "threshold": t?}`` -> the maps of image i;
* ``POST /api/export`` ``{"interventions": [...]}`` -> the patch file (``application/octet-stream``).

Bad requests get a 4xx JSON ``{"error": "..."}``; the server keeps running. Limits: a body of at most
:data:`MAX_BODY` bytes, read within :data:`BODY_SECONDS`; the interventions and time per request of
:mod:`interp.explore.requests` (413 beyond them); at most :data:`MAX_CONNECTIONS` connections at once (503);
idle connections closed and other ``Host`` names refused (:mod:`interp.explore.connections`). A client that
goes away mid-request is logged as one line.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Optional

from ..errors import InterpError
from .connections import IDLE_SECONDS, HostGuard, idle_closing_protocol
from .requests import RequestTooLarge

STATIC_DIR = Path(__file__).resolve().parent / "static"
ASSETS = {"app.js": "text/javascript; charset=utf-8", "draw.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_BODY = 16 * 1024 * 1024  # a drawn target or a mean-ablation spec is far smaller
BODY_SECONDS = 60.0  # to send that body: a local page sends its few KB at once
MAX_CONNECTIONS = 64  # open at once (a browser uses at most 6 per host); more get 503
LOG = logging.getLogger("uvicorn.error")  # uvicorn's server log: one line each, at the server's log level


def require_extra() -> None:
    """Raise a one-line error when the optional web stack (the ``explore`` extra) is not installed."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise InterpError(f"the explorer needs the explore extra ({e.name} is not installed): "
                          "pip install -e '.[explore]'") from None


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _token_of(scope) -> Optional[str]:
    from urllib.parse import parse_qs

    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    if headers.get("x-interp-token"):
        return headers["x-interp-token"]
    auth = headers.get("authorization", "")
    if auth.lower().startswith("token "):
        return auth[6:].strip()
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return (query.get("token") or [None])[0]


class TokenGuard:
    """ASGI middleware: a request without the token gets 401, one with a wrong token 403."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse

        given = _token_of(scope)
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            status = 401 if given is None else 403
            what = "needs its access token" if given is None else "got a wrong access token"
            response = JSONResponse({"error": f"this explorer {what}: open the URL it printed when it started "
                                              "(http://HOST:PORT/?token=...)"}, status_code=status)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def _not_json(name: str):
    raise BadRequest(400, f"request body is not valid JSON: {name} is not a JSON number (numbers must be finite)")


async def _read_body(request) -> bytes:
    """The body, refused (413) as soon as it is over MAX_BODY, before all of it is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise BadRequest(413, f"request body over {MAX_BODY // (1024 * 1024)} MiB")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest(413, f"request body over {MAX_BODY // (1024 * 1024)} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(request) -> dict:
    try:
        body = await asyncio.wait_for(_read_body(request), BODY_SECONDS)
    except asyncio.TimeoutError:
        raise BadRequest(408, f"the request body did not arrive within {BODY_SECONDS:g} s") from None
    try:
        data = json.loads(body or b"null", parse_constant=_not_json)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, an integer of > 4300 digits
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise BadRequest(400, f"request body is not valid JSON: {reason}") from None
    if not isinstance(data, dict):
        raise BadRequest(400, "request body must be a JSON object such as {\"image\": 0, \"interventions\": []}")
    return data


def build_app(session, token: str, host: str = "127.0.0.1"):
    """The Starlette app serving ``session`` behind the Host check (for ``host``, the address it listens on)
    and the token guard."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    def guarded(handler):
        async def endpoint(request):
            try:
                return await handler(request)
            except BadRequest as e:
                return JSONResponse({"error": str(e)}, status_code=e.status)
            except ClientDisconnect:  # nothing to answer: say so in one line, not a traceback
                LOG.warning("interp explore: the client closed the connection during %s %s; nothing was run",
                            request.method, request.url.path)
                return Response(status_code=400)
            except RequestTooLarge as e:  # over a limit of interp.explore.requests
                return JSONResponse({"error": str(e)}, status_code=413)
            except InterpError as e:
                status = 404 if str(e).startswith("unknown image") else 400
                return JSONResponse({"error": str(e)}, status_code=status)
            except (ValueError, TypeError, KeyError, RuntimeError) as e:  # an edit the model cannot run
                return JSONResponse({"error": f"cannot run this request: {type(e).__name__}: {e}"}, status_code=400)
        return endpoint

    async def index(request):
        html = (STATIC_DIR / "index.html").read_text(encoding="utf-8").replace("{{TOKEN}}", token)
        return HTMLResponse(html, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})

    async def asset(request):
        name = request.path_params["name"]
        if name not in ASSETS:
            raise BadRequest(404, f"no asset {name!r}")
        return Response((STATIC_DIR / name).read_bytes(), media_type=ASSETS[name])

    async def info(request):
        return JSONResponse(session.info())

    async def image(request):
        try:
            index = int(request.path_params["index"])
        except ValueError:
            raise BadRequest(404, f"unknown image {request.path_params['index']!r}") from None
        return Response(await run_in_threadpool(session.thumbnail, index), media_type="image/png")

    async def run(request):
        data = await _json_body(request)
        unknown = sorted(set(data) - {"image", "interventions", "threshold"})
        if unknown:
            raise BadRequest(400, f"unknown field(s) {unknown}; /api/run takes image, interventions, threshold")
        if "image" not in data:
            raise BadRequest(400, "missing 'image' (the index of a loaded image)")
        result = await run_in_threadpool(session.run, data["image"], data.get("interventions", []),
                                         data.get("threshold"))
        return JSONResponse(result)

    async def export(request):
        data = await _json_body(request)
        blob = await run_in_threadpool(session.export, data.get("interventions", []))
        return Response(blob, media_type="application/octet-stream",
                        headers={"Content-Disposition": 'attachment; filename="explore-patch.safetensors"'})

    routes = [Route("/", guarded(index)), Route("/static/{name}", guarded(asset)),
              Route("/api/info", guarded(info)), Route("/api/image/{index}", guarded(image)),
              Route("/api/run", guarded(run), methods=["POST"]), Route("/api/export", guarded(export), methods=["POST"])]
    return HostGuard(TokenGuard(Starlette(routes=routes), token), host)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); port 0 picks a free one. One clear error when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InterpError(f"cannot listen on {host}:{port} ({e.strerror}); pass another --port (0: any free one)"
                          ) from None
    sock.listen(64)
    return sock


class ExploreServer:
    """uvicorn serving a session on one socket, in the foreground (:meth:`serve`) or a thread (:meth:`start`)."""

    def __init__(self, session, host: str = "127.0.0.1", port: int = 0, token: Optional[str] = None,
                 idle_seconds: float = IDLE_SECONDS):
        import uvicorn

        self.token = token or secrets.token_hex(24)
        self.host = host
        self.socket = bind(host, port)
        self.port = int(self.socket.getsockname()[1])
        # idle connections close after idle_seconds, also those that never send a whole request
        config = uvicorn.Config(build_app(session, self.token, host), log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=2, timeout_keep_alive=idle_seconds,
                                http=idle_closing_protocol(idle_seconds), limit_concurrency=MAX_CONNECTIONS)
        self.server = uvicorn.Server(config)
        self.thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    def serve(self) -> None:
        """Serve until interrupted (Ctrl-C)."""
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.socket.close()

    def start(self, timeout: float = 10.0) -> "ExploreServer":
        """Serve from a daemon thread; returns once the server accepts requests (else stops it and raises)."""
        self.thread = threading.Thread(target=self.serve, name=f"interp-explore-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise InterpError(f"the explorer server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving and release the socket (idempotent; also for a server that never served)."""
        self.server.should_exit = True
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if thread is None or not thread.is_alive():  # a serving thread closes it itself when it ends
            self.socket.close()
        self.thread = None
