"""Mutual authentication of fiber connections with the run's secret.

Every connection proves it holds the run's secret before anything it sends is
unpickled, in the spirit of multiprocessing's authkey challenge: each side sends a
random nonce and must answer the other's with ``HMAC-SHA256(secret, role + nonce)``.
The secret is created by the first fiber process of a run and reaches its children in
the job's environment (``_FIBER_AUTHKEY``, hex).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading

AUTHKEY_ENV = "_FIBER_AUTHKEY"
NONCE_SIZE = 32
DIGEST_SIZE = 32

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
    global _authkey
    with _lock:
        _authkey = bytes(key)


def new_nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def answer(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


def verify(key: bytes, role: bytes, nonce: bytes, digest: bytes) -> bool:
    return hmac.compare_digest(answer(key, role, nonce), digest)
