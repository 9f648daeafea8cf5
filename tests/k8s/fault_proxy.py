"""A fault proxy in front of the test cluster's real kube-apiserver, for the tests of
how fiber-k8s classifies the API server's errors (docs/backend-errors.md).

:class:`FaultProxy` listens on 127.0.0.1 only (plain HTTP: the client's bearer token
crosses loopback alone) and forwards every request over TLS to the real API server,
streaming answers as they come (a watch works through it). On command
(:meth:`FaultProxy.inject`), the next N requests that match a verb and a path fragment
get a fault instead of being forwarded:

- an HTTP status (``429``, ``503``, ``401``, ...), answered as the API server answers
  it (a ``Status`` object with a message, and ``Retry-After`` when given);
- ``"reset"``: the connection is reset (closed with SO_LINGER 0: the client reads RST);
- ``"stall"``: the request is read and never answered (the connection is held for
  ``stall`` seconds, then closed), what a hung or overloaded server does;
- ``"late"``: the request is held ``stall`` seconds, then forwarded (a slow server
  that does answer).

:func:`kubeconfig_through` writes a kubeconfig that reaches the cluster through the
proxy with the user of another kubeconfig. Every fault served is recorded in
:attr:`FaultProxy.served`.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import socket
import ssl
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding",
               "upgrade", "te", "trailer", "host", "content-length"}
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
            409: "AlreadyExists", 422: "Invalid", 429: "TooManyRequests",
            500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


class _Rule:
    def __init__(self, fault: int | str, count: int, verb: str | None, path: str | None,
                 retry_after: int | None, message: str, stall: float) -> None:
        self.fault, self.left, self.verb, self.path = fault, count, verb, path
        self.retry_after, self.message, self.stall = retry_after, message, stall

    def matches(self, verb: str, path: str) -> bool:
        return (self.left > 0 and (self.verb is None or self.verb == verb)
                and (self.path is None or self.path in path))


class FaultProxy:
    """The proxy (see the module docstring); ``close()`` stops it and every
    connection it holds."""

    def __init__(self, upstream: str, ca_data: bytes | None) -> None:
        parsed = urlparse(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 443)
        self._context = ssl.create_default_context()
        if ca_data:
            self._context.load_verify_locations(cadata=ca_data.decode())
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._open: set[Any] = set()
        self.served: list[tuple[int | str, str, str]] = []
        self.forwarded = 0
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False  # close() ends held connections itself
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="k8s-fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def inject(self, fault: int | str, count: int = 1, verb: str | None = None,
               path: str | None = None, retry_after: int | None = None,
               message: str = "injected by the fault proxy", stall: float = 10.0) -> None:
        """The next ``count`` requests with ``verb`` (e.g. "POST") whose path contains
        ``path`` get ``fault`` (an HTTP status, "reset" or "stall")."""
        with self._lock:
            self._rules.append(_Rule(fault, count, verb, path, retry_after, message, stall))

    def _take(self, verb: str, path: str) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(verb, path):
                    rule.left -= 1
                    self.served.append((rule.fault, verb, path))
                    return rule
            self.forwarded += 1
        return None

    def upstream_connection(self) -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection(*self._upstream, context=self._context,
                                           timeout=120)
        with self._lock:
            self._open.add(conn)
        return conn

    def forget(self, conn: Any) -> None:
        with self._lock:
            self._open.discard(conn)
        conn.close()

    def close(self) -> None:
        self._server.shutdown()
        with self._lock:
            held, self._open = list(self._open), set()
        for item in held:  # watches still streaming, stalled requests
            # shut the socket down first: closing a connection whose response another
            # thread is reading would wait for that read (a watch: up to minutes)
            sock = item if isinstance(item, socket.socket) else getattr(item, "sock", None)
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for item in held:
            try:
                item.close()
            except OSError:
                pass
        port = self._server.server_address[1]
        self._server.server_close()
        self._thread.join(10)
        _reserve(port)


# Ports of closed proxies, kept bound (not listening) until this process exits: a
# client of the cluster that still retries against a closed proxy is refused, instead
# of reaching whatever program of another test binds that port next (a core test's
# fiber program then printed that it refused an HTTP request, in a lanes run).
_RESERVED: list[socket.socket] = []


def _reserve(port: int) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:  # taken already: nothing to keep
        sock.close()
        return
    _RESERVED.append(sock)


class _Handler(http.server.BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # quiet: the tests read FaultProxy.served

    def _relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        rule = self.proxy._take(self.command, self.path)
        if rule is None:
            self._forward(body)
        elif rule.fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
        elif rule.fault == "late":
            time.sleep(rule.stall)
            self._forward(body)
        elif rule.fault == "stall":
            with self.proxy._lock:
                self.proxy._open.add(self.connection)
            deadline = time.monotonic() + rule.stall
            while time.monotonic() < deadline and self.connection.fileno() >= 0:
                time.sleep(0.05)
            self.close_connection = True
        else:
            self._status(int(rule.fault), rule.message, rule.retry_after)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _relay

    def _status(self, code: int, message: str, retry_after: int | None) -> None:
        reason = _REASONS.get(code, "")
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Failure", "message": message, "reason": reason,
                           "code": code}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, body: bytes | None) -> None:
        conn = self.proxy.upstream_connection()
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body is not None:
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            length = answer.getheader("Content-Length")
            if length is not None:
                data = answer.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while chunk := answer.read1(65536):  # a watch: pass each event on at once
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException, AttributeError):
            # the client went, or close() closed the upstream connection under a watch
            # (http.client then reads from a closed file: AttributeError)
            self.close_connection = True
        finally:
            self.proxy.forget(conn)


def kubeconfig_through(proxy: FaultProxy, kubeconfig: str,
                       directory: str | Path | None = None) -> str:
    """A kubeconfig file (in ``directory``) that reaches the cluster through ``proxy``
    with the current context's user of ``kubeconfig``."""
    loaded = yaml.safe_load(Path(kubeconfig).read_text())
    current = next(c for c in loaded["contexts"] if c["name"] == loaded["current-context"])
    user = next(u for u in loaded["users"] if u["name"] == current["context"]["user"])
    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": "proxy", "cluster": {"server": proxy.url}}],
              "users": [user],
              "contexts": [{"name": "proxy", "context": {
                  "cluster": "proxy", "user": user["name"],
                  "namespace": current["context"].get("namespace", "default")}}],
              "current-context": "proxy"}
    out = Path(tempfile.mkdtemp(prefix="fk8s-proxy-", dir=directory)) / "kubeconfig"
    out.write_text(yaml.safe_dump(config))
    out.chmod(0o600)
    return str(out)


def start_in_front_of(kubeconfig: str) -> FaultProxy:
    """A proxy in front of the API server of ``kubeconfig``'s current context."""
    loaded = yaml.safe_load(Path(kubeconfig).read_text())
    current = next(c for c in loaded["contexts"] if c["name"] == loaded["current-context"])
    cluster = next(c for c in loaded["clusters"]
                   if c["name"] == current["context"]["cluster"])["cluster"]
    ca = cluster.get("certificate-authority-data")
    if ca:
        ca_data: bytes | None = base64.b64decode(ca)
    elif cluster.get("certificate-authority"):
        ca_data = Path(cluster["certificate-authority"]).read_bytes()
    else:
        ca_data = None
    return FaultProxy(cluster["server"], ca_data)
