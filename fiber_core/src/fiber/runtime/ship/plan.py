"""What a job of a target gets shipped, decided once per process: the ``ship``
setting read, the code and packages packed (:mod:`.code`, :mod:`.packages`,
:mod:`.archive`), offered on the hub's ship channel (:mod:`.serving`), and the job's
command and environment that make its stub (:mod:`.stub`) fetch them.

The setting (a list; comma-separated in the environment and files):

``auto`` (the default)
    ship when the backend says its jobs do not see this machine's files
    (:attr:`Backend.shares_files <fiber.backend.Backend.shares_files>` false); no
    backend of fiber's says so, so nothing is shipped and a job runs
    ``<python> -m fiber.runtime.bootstrap`` as it always did (the local backend forks
    it from its template);
``off``
    never ship;
``on``
    ship the defaults: the main module's directory, fiber-core, the backend's plugin
    and every package they require;
anything else
    ship the defaults and these: a directory or a file (relative to the working
    directory), a top-level module by name, ``pkg:NAME`` (an installed distribution
    and what it requires), ``req:FILE`` (each requirement of a requirements file, as
    installed here).

A job that gets a shipment runs ``<python> -I -c <stub>``, where ``<python>`` is the
``python`` setting, else ``python3.X`` (this interpreter's version, found on the
host's ``PATH``); ``-I`` keeps the host's ``PYTHONPATH`` and user site out.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fiber.backend import Backend, registry
from fiber.runtime import config
from fiber.runtime.ship import archive as archives
from fiber.runtime.ship import code, packages, stub
from fiber.runtime.ship.serving import ShipChannel
from fiber.wire import transport

__all__ = ["Shipment", "command", "job_env", "shipment", "wanted"]

def wanted(cfg: config.Config, backend: Backend) -> bool:
    """Whether jobs of ``backend`` with the settings ``cfg`` get a shipment."""
    items = cfg.values.get("ship") or ["auto"]
    if items == ["off"]:
        return False
    if items == ["auto"]:
        return not getattr(backend, "shares_files", True)
    return True


def python(cfg: config.Config) -> str:
    """The interpreter a shipped job runs (the ``python`` setting, else python3.X)."""
    return str(cfg.python or "python{}.{}".format(*sys.version_info[:2]))


def _launcher() -> str:
    """The ``-c`` program of a shipped job: a check that the interpreter can run the
    stub at all (an old one could not even compile it), then the stub's source
    (compressed: it travels on a command line)."""
    with open(stub.__file__, "rb") as f:
        source = f.read()
    packed = base64.b64encode(zlib.compress(source, 9)).decode()
    want = "{}.{}".format(*sys.version_info[:2])
    ours = f"Python {sys.version.split()[0]} ({sys.executable})"
    advice = (f" is too old: the program runs {ours}; install Python {want} on this "
              "host and name it in the python setting (FIBER_PYTHON)\n")
    return (
        "import sys\n"
        "if sys.version_info < (3, 7):\n"
        "    sys.stderr.write('fiber: this job cannot run here: its Python, ' + "
        "sys.executable + ' ' + sys.version.split()[0] + " + repr(advice) + ")\n"
        "    sys.exit(3)\n"
        "import base64, zlib\n"
        f"exec(compile(zlib.decompress(base64.b64decode('{packed}')), "
        "'fiber-ship-stub', 'exec'))\n"
    )


_launcher_text: str | None = None


def command(cfg: config.Config) -> list[str]:
    """The command of a shipped job."""
    global _launcher_text
    if _launcher_text is None:
        _launcher_text = _launcher()
    return [python(cfg), "-I", "-c", _launcher_text]


@dataclass(frozen=True)
class Shipment:
    """What jobs of one target get: the archives and the roots of the code."""

    archives: tuple[archives.Archive, ...]
    roots: tuple[code.Root, ...]
    cwd: tuple[str, str] | None  # (the root it is in, the path below it)


_lock = threading.Lock()
_interpreter: dict[str, Any] | None = None  # this one, as the stub compares it
_shipments: dict[tuple[Any, ...], Shipment] = {}
# the ship channel of each hub (by the hub; its channel id)
_channels: weakref.WeakKeyDictionary[Any, tuple[ShipChannel, int]] = (
    weakref.WeakKeyDictionary())


def _plan(items: Sequence[str], plugin: str, limit: int) -> Shipment:
    cwd = os.getcwd()
    roots: list[code.Root] = []
    wanted_packages: list[tuple[str, str]] = [("fiber-core", "fiber")]
    if plugin != "fiber-core":
        wanted_packages.append((plugin, "the backend"))
    main = code.main_root()
    if main is not None:
        roots.append(main)
    for item in items:
        if item in config.SHIP_WORDS:
            continue
        kind, _, rest = item.partition(":")
        if kind in ("pkg", "package"):
            wanted_packages.append((rest, "the ship setting"))
        elif kind in ("req", "requirements"):
            for name in packages.requirement_names(rest, cwd):
                wanted_packages.append((name, f"the requirements file {rest}"))
        else:
            root = code.named_root(item, cwd)
            same = next((r for r in roots if r.path == root.path), None)
            if same is None:
                roots.append(root)
            elif same.only is not None:
                same.only = None if root.only is None else same.only | root.only
    entries: list[tuple[str, str]] = []
    used: set[str] = set()
    for root in roots:
        base = os.path.basename(root.path.rstrip(os.sep)) or "root"
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        root.name = name
        entries.extend((f"{name}/{rel}", source) for rel, source in code.walk(root))
    shipped = []
    if entries:
        shipped.append(archives.build("code", entries, limit))
    files: dict[str, str] = {}
    for dist in packages.closure(wanted_packages):
        for rel, source in packages.files_of(dist):
            files.setdefault(rel, source)
    shipped.append(archives.build("packages", sorted(files.items()), limit))
    where = None
    for root in sorted(roots, key=lambda r: -len(r.path)):
        if cwd == root.path or cwd.startswith(root.path.rstrip(os.sep) + os.sep):
            where = (root.path, os.path.relpath(cwd, root.path))
            break
    return Shipment(tuple(shipped), tuple(roots), where)


def shipment(cfg: config.Config, backend: Backend) -> Shipment:
    """The shipment of jobs of ``backend`` with the settings ``cfg`` (made on first
    use in this process; raises :class:`ShipError` for what cannot be shipped)."""
    items = tuple(cfg.values.get("ship") or ())
    info = registry.backends().get(backend.name)
    plugin = info.package if info is not None else "fiber-core"
    limit = int(cfg.values.get("ship_limit") or 512) << 20
    key = (items, plugin, limit, os.getcwd())
    with _lock:
        found = _shipments.get(key)
        if found is None:
            found = _shipments[key] = _plan(items, plugin, limit)
        return found


def _channel(hub: transport.Hub) -> tuple[ShipChannel, int]:
    with _lock:
        found = _channels.get(hub)
        if found is None:
            channel = ShipChannel()
            found = _channels[hub] = (channel, hub.add_channel(channel, stream=True))
        return found


def job_env(cfg: config.Config, backend: Backend, hub: transport.Hub) -> dict[str, str]:
    """The variables that make a job's stub fetch its shipment from ``hub``."""
    plan = shipment(cfg, backend)
    channel, cid = _channel(hub)
    with _lock:
        global _interpreter
        if _interpreter is None:
            # once, under the lock: sysconfig fills its variables without one (3.11), so
            # a pool's starter threads asking at once could read SOABI before it is set
            _interpreter = stub.interpreter()
    for archive in plan.archives:
        channel.offer(archive)
    conf = {
        "channel": cid,
        "archives": [{"kind": a.kind, "key": a.key, "size": a.size, "unpacked": a.unpacked}
                     for a in plan.archives],
        "roots": [{"parent": r.path, "name": r.name, "path": r.on_path} for r in plan.roots],
        "cwd": list(plan.cwd) if plan.cwd else None,
        "python": _interpreter,
        "cache": cfg.values.get("ship_cache") or "",
        "cache_size": int(cfg.values.get("ship_cache_size") or 4096) << 20,
    }
    return {stub.SHIP_ENV: json.dumps(conf, separators=(",", ":"))}

