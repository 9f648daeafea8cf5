"""How a process reaches a mailbox-backed object (queue, pipe) that may live in
another process: directly when it lives here, else through a client connection to
the owner's hub, with one request line per thread so that a thread blocked in
``get`` does not hold up another thread's ``put``."""

from __future__ import annotations

import os
import threading

from fiber.runtime.mailbox import encode, parse_owner
from fiber.wire import shm, transport
from fiber.wire.protocol import MailboxOp

# A remote wait with a timeout is timed out by the owner; this much longer the
# caller waits for the owner's answer before it calls the connection lost.
TIMEOUT_SLACK = 30.0


class Endpoint:
    def __init__(self, address: str, cid: int) -> None:
        self.address = address
        self.cid = cid
        self._local = None
        self._tls = threading.local()
        self._shm_owner: int | None | bool = False  # False: not asked yet
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

    def shm_owner(self, prefix: bytes = b"") -> int | None:
        """The pid of the process holding this object when it is on this host (so
        large buffers may go through shared memory), else None. Asked once per
        endpoint with a mailbox ``H`` request (``prefix`` + request, e.g. a pipe's side)."""
        if shm.host_token() is None:
            return None
        if self._local is not None:
            return os.getpid()
        if self._shm_owner is False:
            try:
                owner = parse_owner(self.request(prefix + encode(MailboxOp.OWNER, 0)))
            except Exception:  # noqa: BLE001 - an owner that cannot tell: send bytes
                owner = None
            self._shm_owner = owner
        return self._shm_owner
