"""``fiber dashboard``: a live web page about a running fiber program's pools.

It finds the program as ``fiber top`` does (:func:`fiber.top.choose`: the registrations
of :mod:`fiber.runtime.status`), serves a page on 127.0.0.1 (by default) with a random
token in its URL, and asks the program over the program's own authenticated connection,
only while a page is open (:mod:`fiber.dashboard.feed`): nothing new listens in the
program, and a program nobody looks at is not asked anything. The server and what it
refuses are in :mod:`fiber.dashboard.server`; the page (HTML, a script that draws its
plots as SVG, a style sheet) is package data in ``static/``, served from here, so it
works on machines without internet. It needs nothing beyond fiber-core.

Its two threads are fiber threads (:mod:`fiber.threads`): ``fiber-dashboard-http``
serves the requests, ``fiber-dashboard-feed`` asks the program; if either dies, the
command says why and ends with status 1 (an open page is told first).
"""

from __future__ import annotations

import argparse
import errno
import secrets
import socket
import sys
import time

from fiber import threads
from fiber.dashboard.feed import Feed
from fiber.dashboard.server import DashboardServer
from fiber.errors import FiberThreadError, NotPrivateError
from fiber.top import TopError, choose

__all__ = ["DEFAULT_PORT", "command", "url"]

DEFAULT_PORT = 8790  # the first port tried; the next ones when it is taken
PORTS_TRIED = 20


def url(server: DashboardServer) -> str:
    """The page's address, token included."""
    host, port = str(server.server_address[0]), server.server_address[1]
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/?token={server.token}"


def _bind(host: str, port: int, feed: Feed, token: str) -> DashboardServer:
    """A server on ``port``, or (for the default port) the next free one."""
    last: OSError | None = None
    tries = PORTS_TRIED if port == DEFAULT_PORT else 1
    for candidate in range(port, port + tries):
        try:
            return DashboardServer((host, candidate), feed, token)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise TopError(f"cannot listen on {host}:{candidate}: {exc}") from None
            last = exc
    raise TopError(f"cannot listen on {host}, ports {port}-{port + tries - 1}: {last}")


def serve(args: argparse.Namespace) -> int:
    """``fiber dashboard`` with its parsed options (``pid``, ``host``, ``port``,
    ``interval``): serves until Ctrl-C, or until the program ends."""
    program = choose(args.pid)
    feed = Feed(program, args.interval)
    server = _bind(args.host, args.port, feed, secrets.token_urlsafe(24))
    died: list[FiberThreadError] = []
    thread = threads.start("fiber-dashboard-http", server.serve_forever, 0.2,
                           fails=died.append)
    port = server.server_address[1]
    print(f"fiber dashboard of program {program.pid} ({' '.join(program.argv)[:80]}), "
          f"run {program.run}:\n    {url(server)}\n"
          f"From another machine: ssh -N -L {port}:127.0.0.1:{port} "
          f"{_login()}, then open that URL there. Ctrl-C stops it.", flush=True)
    try:
        while thread.is_alive() and feed.failure is None:
            if not program.alive():
                print(f"fiber dashboard: program {program.pid} has ended", flush=True)
                time.sleep(min(2.0, args.interval * 2))  # open pages are told so
                return 0
            time.sleep(0.5)
        if feed.failure is not None:
            print(f"fiber dashboard: {feed.failure}", file=sys.stderr)
            return 1
        print(f"fiber dashboard: {died[0] if died else 'its HTTP server stopped'}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stopping.set()
        if thread.is_alive():  # (shutdown() waits for serve_forever, which may never have run)
            server.shutdown()
        server.server_close()


def _login() -> str:
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "USER"
    return f"{user}@{socket.gethostname()}"


def command(args: argparse.Namespace) -> int:
    """The entry of ``fiber dashboard`` (errors are messages on stderr, exit status 1)."""
    try:
        return serve(args)
    except (TopError, NotPrivateError) as exc:
        print(f"fiber dashboard: {exc}", file=sys.stderr)
        return 1
