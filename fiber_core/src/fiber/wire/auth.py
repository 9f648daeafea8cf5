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
with :func:`fiber.backend.secrets.load_secrets`). The bootstrap then takes it out of the
environment (:func:`take_from_environment`): the job holds it in memory only, and the
programs its tasks start do not inherit it.

A child started by the *standard library* (``multiprocessing`` with spawn or
forkserver) from a fiber process gets the secret the way multiprocessing's children
get their ``authkey``: in the pickle its parent writes for it. fiber's objects add it
to their pickled state only while a standard-library Popen pickles a starting
process's arguments (:func:`for_stdlib_child`, as multiprocessing's manager proxies do
with their authkey), and their rebuild adopts it (:func:`adopt`); it is never on a
command line, and never in a pickle that travels over the network. A child started
with fork inherits it in memory.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading

from fiber.wire.protocol import NONCE_SIZE

__all__ = ["AUTHKEY_ENV", "NONCE_SIZE", "adopt", "answer", "for_stdlib_child", "get_authkey",
           "new_nonce", "set_authkey", "take_from_environment", "verify"]

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


def take_from_environment() -> None:
    """A job's side, at its start: read the secret from the environment and remove it
    from there, so that the programs its tasks start (a shell command, a simulator)
    do not inherit it. The job keeps it in memory; the jobs it starts get it from
    there as every job does."""
    get_authkey()
    os.environ.pop(AUTHKEY_ENV, None)


def set_authkey(key: bytes) -> None:
    """Use ``key`` as the run's secret (a process given one explicitly)."""
    global _authkey
    with _lock:
        _authkey = bytes(key)


def for_stdlib_child() -> bytes | None:
    """The secret when a standard-library Popen (multiprocessing's spawn or forkserver)
    is pickling a starting process on this thread, else None. A fiber job's own Popen
    marks itself (``fiber_job``): its payload crosses the network, and jobs get the
    secret in their environment."""
    from multiprocessing import context  # stdlib, already imported by fiber's API

    popen = context.get_spawning_popen()
    if popen is None or getattr(popen, "fiber_job", False):
        return None
    return get_authkey()


def adopt(key: bytes | None) -> None:
    """Take ``key``, the secret a fiber object brought from its parent's pickle, as
    this process's secret if it has none yet (a child started by multiprocessing)."""
    global _authkey
    if not key:
        return
    with _lock:
        if _authkey is None and not os.environ.get(AUTHKEY_ENV):
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
