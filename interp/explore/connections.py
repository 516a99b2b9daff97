"""The explorer's connection hygiene: which ``Host`` it answers, and closing connections that sit idle.

* **Host check** (:class:`HostGuard`): a request whose ``Host`` header does not name the address the
  explorer listens on, ``localhost`` or a loopback address gets 400. A web page elsewhere that re-points its
  own DNS name at 127.0.0.1 (DNS rebinding) sends its own name as ``Host``, so it is refused even before the
  access token is checked. On a wildcard address (``--host 0.0.0.0`` or ``::``) any IP address and this
  machine's host name are accepted too: an IP address cannot be re-pointed, and the explorer cannot know which
  of its addresses a client used.
* **Idle connections** (:func:`idle_closing_protocol`): uvicorn closes a keep-alive connection
  ``timeout_keep_alive`` seconds after its last answer, but never one that has not sent a whole request head
  (a client that connects and says nothing, or trickles a header). Here a connection that has not started a
  new request within :data:`IDLE_SECONDS` of opening or of its last answer is closed; a request being
  answered (a long forward) is never cut.

>>> host_allowed("127.0.0.1:8765", "127.0.0.1"), host_allowed("localhost", "127.0.0.1")
(True, True)
>>> host_allowed("attacker.example:8765", "127.0.0.1"), host_allowed("10.0.0.7:80", "0.0.0.0")
(False, True)
"""
from __future__ import annotations

import ipaddress
import socket
from typing import Optional

IDLE_SECONDS = 5.0  # uvicorn's own default keep-alive; a browser simply opens a new connection after it
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def _host_name(header: str) -> str:
    """``Host`` without its port, lower case, without brackets or a trailing dot."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8765
        return header[1:header.find("]")] if "]" in header else header
    name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return name.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(header: Optional[str], bound: str) -> bool:
    """Whether a request's ``Host`` header names the explorer bound to ``bound`` (see the module doc)."""
    if not header:
        return False
    name, bound = _host_name(header), bound.strip("[]").lower()
    if name in ("localhost", bound) or (_is_address(name) and ipaddress.ip_address(name).is_loopback):
        return True
    if bound in WILDCARD_HOSTS:
        return _is_address(name) or name in (socket.gethostname().lower(), socket.getfqdn().lower())
    return False


class HostGuard:
    """ASGI middleware: a request whose ``Host`` does not name this explorer gets 400 (module doc)."""

    def __init__(self, app, bound: str):
        self.app, self.bound = app, bound

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if host_allowed(host, self.bound):
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse

        response = JSONResponse({"error": f"this explorer answers only requests for {self.bound} or localhost, "
                                          f"not for Host {host!r}: open the URL it printed"}, status_code=400)
        return await response(scope, receive, send)


def idle_closing_protocol(idle_seconds: float = IDLE_SECONDS):
    """uvicorn's h11 protocol class, closing a connection that starts no request within ``idle_seconds`` of
    opening or of its last answer (pass it as ``uvicorn.Config(http=...)``)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class IdleClosingH11(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._idle_check = self.loop.call_later(idle_seconds, self._close_if_idle, None)

        def _close_if_idle(self, seen) -> None:
            """Close when no request has started since the last check (``seen``: the request then)."""
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and cycle is seen:
                self.transport.close()
                return
            self._idle_check = self.loop.call_later(idle_seconds, self._close_if_idle, cycle)

        def connection_lost(self, exc) -> None:
            self._idle_check.cancel()
            super().connection_lost(exc)

    return IdleClosingH11
