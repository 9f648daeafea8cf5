"""uber/fiber 0.2's ``fiber.backend.get_backend()``, kept so its programs run (its Ring
example calls ``get_backend().get_listen_addr()``). Deprecated: ``fiber.backend`` is
now the backend contract for plugins; a program reaches its backend through
``fiber.runtime.run.backend()``, and the address its jobs reach it at is the
``listen_address`` setting or what its backend says (``Backend.listen_address()``).

``fiber.backend.get_backend`` finds this module by name (``fiber.backend`` is a lower
layer than the runtime this module uses; see docs/architecture.md's layers).
"""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import Any

from fiber import util
from fiber.backend import Backend, registry
from fiber.runtime import config, run

SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


def _interface_of(ip: str) -> str:
    """The name of this host's network interface with address ``ip`` ("" if none)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return ""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR,
                                     struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    return ""


class LegacyBackend:
    """A backend as uber/fiber's ``get_backend()`` returned it: fiber's
    :class:`~fiber.backend.Backend` (its attributes pass through) plus
    ``get_listen_addr()``."""

    def __init__(self, backend: Backend, listen_host: str) -> None:
        self._backend = backend
        self._listen_host = listen_host

    def get_listen_addr(self) -> tuple[str, int, str]:
        """``(ip, port, interface)`` at which other processes of the run reach this one:
        the host its hub listens at (port 0: any; the interface that has the address,
        "" when none has it, e.g. a name)."""
        ip = self._listen_host
        try:
            ip = socket.gethostbyname(ip)
        except OSError:
            pass
        return ip, 0, _interface_of(ip)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def get_backend(name: str | None = None, **kwargs: Any) -> LegacyBackend:
    """The backend of this process (``name``: that backend, with ``kwargs`` as its
    settings), as uber/fiber 0.2's ``fiber.backend.get_backend``. Deprecated."""
    util.warn_deprecated(
        "fiber.backend.get_backend",
        "fiber.backend.get_backend() is deprecated: use fiber.runtime.run.backend() "
        "(the address jobs reach this process at: fiber.runtime.run.listen_host())")
    if name is None and not kwargs:
        return LegacyBackend(run.backend(), run.listen_host())
    cfg = config.overlay(config.get_config(), {"backend": name, **kwargs}
                         if name is not None else kwargs, "get_backend()")
    variant = "get_backend:" + repr(sorted((key, repr(value)) for key, value in kwargs.items()))
    backend = registry.get_backend(cfg.backend, cfg.as_dict(), variant)
    return LegacyBackend(backend, str(cfg.listen_address or backend.listen_address()))
