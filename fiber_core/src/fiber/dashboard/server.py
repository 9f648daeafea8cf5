"""The dashboard's HTTP server: the page, its script and style, and the event stream of
views (:mod:`fiber.dashboard.feed`), for whoever holds the token.

Built on the standard library's :class:`~http.server.ThreadingHTTPServer`, bounded:

* **Every request needs the token** (``?token=...`` in its URL, or an
  ``Authorization: token ...`` header), compared in constant time
  (:func:`hmac.compare_digest`): none is refused with 401, a wrong one with 403.
* **Its Host header must name this machine** (``localhost``, ``127.0.0.1``, ``[::1]``,
  or the address the server was told to bind): a page of another site that a DNS
  rebinding points at this port is refused (403) even before it guesses a token.
* **Bounded handling**: at most :data:`MAX_CONNECTIONS` connections are handled at once
  (more are closed at once); a connection has :data:`HEAD_SECONDS` seconds and
  :data:`HEAD_BYTES` bytes to send its request's head, and at most
  :data:`MAX_STREAMS` of them hold an event stream (more get 503). Writes time out
  after :data:`WRITE_SECONDS`, so a reader that stalls lets its thread go.
* **Headers that keep other sites out**: no CORS header (a script of another origin
  cannot read an answer), ``X-Frame-Options: DENY`` and CSP ``frame-ancestors 'none'``
  (no framing), ``default-src 'self'`` (no inline or foreign script), ``nosniff``,
  ``Referrer-Policy: no-referrer`` (the token does not leak through links) and
  ``Cache-Control: no-store``.
* **Read-only**: GET (and HEAD) of the page, its two files, ``/events``,
  ``/api/view`` and ``/api/log`` (the tail of a worker's job log); any other method is refused (501), any other path is 404. Nothing in a
  view is a secret of the run (the snapshot holds no key).
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import select
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fiber.dashboard.feed import Feed
from fiber.errors import FiberThreadError

__all__ = ["HEAD_BYTES", "HEAD_SECONDS", "MAX_CONNECTIONS", "MAX_STREAMS", "SECURITY_HEADERS",
           "DashboardServer"]

logger = logging.getLogger("fiber")

MAX_CONNECTIONS = 32  # connections handled at once (each has a thread while handled)
MAX_STREAMS = 16  # of them, event streams
HEAD_SECONDS = 5.0  # to send a request's line and headers
HEAD_BYTES = 16 * 1024  # their size
WRITE_SECONDS = 10.0
KEEPALIVE_SECONDS = 15.0  # a comment line on a stream with no news, to notice a gone page

SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

# the files of the page: path -> (file in static/, content type)
FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def _static(name: str) -> bytes:
    return resources.files("fiber.dashboard").joinpath("static").joinpath(name).read_bytes()


class _HeadReader(io.RawIOBase):
    """The connection's bytes until the request's head is read: each read waits at most
    until the deadline, and the head may not exceed ``limit`` bytes."""

    def __init__(self, sock: socket.socket, seconds: float, limit: int) -> None:
        self._sock = sock
        self._deadline = time.monotonic() + seconds
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's head took too long")
        if self._left <= 0:
            raise ValueError("the request's head is too large")
        self._sock.settimeout(left)
        view = memoryview(buffer)[:self._left]
        n = self._sock.recv_into(view)
        self._left -= n
        return n


class DashboardServer(ThreadingHTTPServer):
    """Serves ``feed``'s views to requests that carry ``token`` (see the module)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], feed: Feed, token: str) -> None:
        self.feed = feed
        self.token = token
        self.allowed_hosts = set(LOCAL_NAMES)
        if address[0] not in ("", "0.0.0.0", "::"):
            self.allowed_hosts.add(address[0].strip("[]"))
        self.any_host = address[0] in ("", "0.0.0.0", "::")  # the user chose to be reached
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.streams = threading.BoundedSemaphore(MAX_STREAMS)
        self.stopping = threading.Event()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: this one is closed
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("dashboard: request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "fiber-dashboard"

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_HeadReader(self.connection, HEAD_SECONDS, HEAD_BYTES))

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, ValueError, OSError):
            self.close_connection = True  # a slow or oversized head: dropped

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        logger.debug("dashboard: %s %s", self.address_string(), format % args)

    # -- answers --------------------------------------------------------------------
    def _headers(self, code: int, ctype: str, length: int | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        self.connection.settimeout(WRITE_SECONDS)
        self._headers(code, ctype, len(body))
        if self.command != "HEAD":
            self.wfile.write(body)

    def _allowed(self) -> bool:
        """The request names this machine and carries the token; else it is answered."""
        host = (self.headers.get("Host") or "").strip()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]").lower()
        if not self.server.any_host and name not in self.server.allowed_hosts:
            self._send(HTTPStatus.FORBIDDEN, b"this dashboard answers requests for "
                       b"localhost only (Host header refused)\n")
            return False
        query = parse_qs(urlsplit(self.path).query)
        given = (query.get("token") or [""])[0]
        auth = self.headers.get("Authorization") or ""
        if not given and auth.lower().startswith("token "):
            given = auth[6:].strip()
        if not given:
            self._send(HTTPStatus.UNAUTHORIZED, b"this page needs its token: open the URL "
                       b"`fiber dashboard` printed (it ends with ?token=...)\n")
            return False
        if not hmac.compare_digest(given.encode(), self.server.token.encode()):
            self._send(HTTPStatus.FORBIDDEN, b"wrong token: open the URL `fiber dashboard` "
                       b"printed\n")
            return False
        return True

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._allowed():
            return
        path = urlsplit(self.path).path
        if path in FILES:
            name, ctype = FILES[path]
            body = _static(name)
            if name == "index.html":  # its files are asked for with the token too
                body = body.replace(b"__TOKEN__", self.server.token.encode())
            self._send(HTTPStatus.OK, body, ctype)
        elif path == "/api/view":
            try:
                _, data = self.server.feed.next(0, 0)
                if not data:  # nobody watches: ask once, now
                    with self.server.feed.watch():
                        _, data = self.server.feed.next(0, 10.0)
                if self.server.feed.error is not None:
                    raise self.server.feed.error
            except FiberThreadError as exc:  # the poller died: the command ends
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, json.dumps(
                    {"error": f"the dashboard stopped: {exc}", "failed": True}).encode(),
                    "application/json")
                return
            self._send(HTTPStatus.OK, (data or "{}").encode(), "application/json")
        elif path == "/api/log":
            query = parse_qs(urlsplit(self.path).query)
            try:
                pool_id = int((query.get("pool") or [""])[0])
                wid = int((query.get("worker") or [""])[0])
            except ValueError:
                self._send(HTTPStatus.BAD_REQUEST, b"pool and worker are numbers\n")
                return
            answer = self.server.feed.log(pool_id, wid)
            self._send(HTTPStatus.OK, json.dumps(answer).encode(), "application/json")
        elif path == "/events":
            self._events()
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n")

    def _gone(self) -> bool:
        """The page closed its end (a stream's page sends nothing after its request)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _events(self) -> None:
        if self.command == "HEAD":
            self._send(HTTPStatus.OK, b"", "text/event-stream")
            return
        if not self.server.streams.acquire(blocking=False):
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"too many pages open\n")
            return
        try:
            self.connection.settimeout(WRITE_SECONDS)
            self._headers(HTTPStatus.OK, "text/event-stream")
            self.wfile.write(b"retry: 2000\n\n")
            self.wfile.flush()
            seq = 0
            with self.server.feed.watch():
                while not self.server.stopping.is_set() and not self._gone():
                    seq, data = self.server.feed.next(seq, KEEPALIVE_SECONDS)
                    chunk = f"data: {data}\n\n" if data else ": keepalive\n\n"
                    self.wfile.write(chunk.encode())
                    self.wfile.flush()
                    if data and ('"ended"' in data or '"failed"' in data) and \
                            set(json.loads(data)) & {"ended", "failed"}:
                        break
        except FiberThreadError as exc:  # the poller died (its last view, if any, said so)
            failed = {"error": f"the dashboard stopped: {exc}", "failed": True}
            try:
                self.wfile.write(f"data: {json.dumps(failed)}\n\n".encode())
                self.wfile.flush()
            except OSError:
                pass
        except OSError:
            pass  # the page went away
        finally:
            self.server.streams.release()
            self.close_connection = True
