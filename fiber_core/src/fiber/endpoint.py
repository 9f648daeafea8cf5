"""How a process reaches a mailbox-backed object (queue, pipe) that may live in
another process: directly when it lives here, else through a client connection to
the owner's hub, with one request line per thread so that a thread blocked in
``get`` does not hold up another thread's ``put``."""

from __future__ import annotations

import threading

from fiber import transport

# A remote wait with a timeout is timed out by the owner; this much longer the
# caller waits for the owner's answer before it calls the connection lost.
TIMEOUT_SLACK = 30.0


class Endpoint:
    def __init__(self, address: str, cid: int) -> None:
        self.address = address
        self.cid = cid
        self._local = None
        self._tls = threading.local()
        hub = transport.local_hub(address)
        if hub is not None:
            self._local = hub.channel(cid)

    @property
    def local(self):
        """The channel object when it lives in this process, else None."""
        return self._local

    def request(self, payload: bytes, timeout: float | None = None) -> bytes:
        ctx = getattr(self._tls, "ctx", None)
        if ctx is None or ctx._client.lost:
            ctx = self._tls.ctx = transport.get_client(self.address).context()
        return ctx.request(self.cid, payload,
                           None if timeout is None else timeout + TIMEOUT_SLACK)
