"""The run's secret and the HMAC primitives of fiber's mutual authentication.

Every connection proves it holds the run's secret before anything it sends is
unpickled, in the spirit of multiprocessing's authkey challenge: each side sends a
random nonce and must answer the other's with ``HMAC-SHA256(secret, role + nonce)``
(the exchange is :mod:`fiber.wire.handshake`). The secret is created by the first
fiber process of a run and reaches each of its jobs as ``_FIBER_AUTHKEY`` (hex) in the
job process's environment, never in the job's description on the cluster: the core
hands it to the backend apart from the job's environment (``JobSpec.secrets``), the
backend delivers it privately, and a job whose backend wrote it to a secrets file has
read that file into its environment before anything here runs (the job's bootstrap,
with :func:`fiber.backend.secrets.load_secrets`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading

from fiber.wire.protocol import NONCE_SIZE

__all__ = ["AUTHKEY_ENV", "NONCE_SIZE", "answer", "get_authkey", "new_nonce", "set_authkey",
           "verify"]

AUTHKEY_ENV = "_FIBER_AUTHKEY"

_lock = threading.Lock()
_authkey: bytes | None = None


def get_authkey() -> bytes:
    """The run's secret: inherited from the parent, or created for a new run."""
    global _authkey
    with _lock:
        if _authkey is None:
            inherited = os.environ.get(AUTHKEY_ENV)
            _authkey = bytes.fromhex(inherited) if inherited else os.urandom(32)
        return _authkey


def set_authkey(key: bytes) -> None:
    """Use ``key`` as the run's secret (a process given one explicitly)."""
    global _authkey
    with _lock:
        _authkey = bytes(key)


def new_nonce() -> bytes:
    """A fresh random challenge."""
    return os.urandom(NONCE_SIZE)


def answer(key: bytes, role: bytes, nonce: bytes) -> bytes:
    """The proof of holding ``key``, for the challenge ``nonce``, by the side ``role``."""
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


def verify(key: bytes, role: bytes, nonce: bytes, digest: bytes) -> bool:
    """Whether ``digest`` is the proof :func:`answer` gives (compared in constant time)."""
    return hmac.compare_digest(answer(key, role, nonce), digest)
