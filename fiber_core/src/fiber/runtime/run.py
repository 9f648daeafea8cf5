"""This process's place in a run: the run's id, whether this process is a job, the
backend it creates jobs on, the address it listens on and its hub.

Where jobs go is a :class:`Target`: a backend name with setting overrides (a context
of :func:`fiber.get_context`, such as ``get_context("slurm", slurm_partition="gpu")``),
its backend instance (one per name and overrides), and the hub its jobs reach (one hub
per listen address, :func:`fiber.wire.transport.get_hub`). The default target follows
the settings. A context carries its target (``ctx.run_target()``, a :class:`Carrier`)
and passes itself (``ctx=``) to every object it makes; an object asks :func:`of` for
the target of the context it was given, whose hub serves it and whose backend starts
its jobs. No context (None, or one of multiprocessing's) means the default target,
the target of the default context (whose start methods all share it).

The wire below knows nothing of settings or backends: what it needs from here (the
host to listen on) is passed to it by :func:`hub`.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Mapping
from typing import Any, Protocol, TypeGuard, runtime_checkable

from fiber.backend import Backend, Resources, registry
from fiber.runtime import config, runs
from fiber.runtime.ship import plan as ship
from fiber.wire import transport

__all__ = ["run_id", "is_job", "backend", "listen_host", "hub", "Target", "target",
           "Carrier", "carries", "of", "check_not_importing_main"]

RUN_ENV = "_FIBER_RUN"
#: the module every job runs (``python -m BOOTSTRAP``)
BOOTSTRAP = "fiber.runtime.bootstrap"

_lock = threading.Lock()
_is_job = False  # set by the bootstrap of a job
_importing_main = False  # set by the bootstrap while the job imports its parent's main

_IMPORTING_MAIN_MESSAGE = """\
An attempt has been made to start a new process before the current process has
finished its bootstrapping phase: this fiber job is still importing the parent's
__main__ module.

Every fiber job imports the main module of its parent (like multiprocessing's spawn
start method), so code at the top level of the script runs again in each job. Start
processes, pools and managers only under the idiom in the main module:

    if __name__ == '__main__':
        ...
"""


def run_id() -> str:
    """The id of this run: every process of one program shares it (job labels)."""
    value = os.environ.get(RUN_ENV)
    if not value:
        value = uuid.uuid4().hex[:12]
        os.environ[RUN_ENV] = value
    return value


def is_job() -> bool:
    """Whether this process is a fiber job (else the main process of its program)."""
    return _is_job


def set_job(importing_main: bool) -> None:
    """Called by the bootstrap: this process is a job, importing its parent's main
    module while ``importing_main``."""
    global _is_job, _importing_main
    _is_job = True
    _importing_main = importing_main


def check_not_importing_main() -> None:
    """Raise RuntimeError when called while the job imports its parent's main module
    (as multiprocessing.spawn._check_not_importing_main)."""
    if _importing_main:
        raise RuntimeError(_IMPORTING_MAIN_MESSAGE)


def job_command(cfg: config.Config | None = None,
                backend: Backend | None = None) -> list[str]:
    """The command every job of this process runs (``python -m BOOTSTRAP``, with the
    ``python`` setting's interpreter, of ``cfg`` when given); for jobs of ``backend``
    that get a shipment (:mod:`fiber.runtime.ship`), its stub."""
    cfg = cfg or config.get_config()
    if backend is not None and ship.wanted(cfg, backend):
        return ship.command(cfg)
    return [cfg.python or sys.executable, "-m", BOOTSTRAP]


class Target:
    """A backend and the settings its jobs get: ``name`` (None: the ``backend``
    setting) with ``overrides`` on top of this process's settings."""

    def __init__(self, name: str | None = None,
                 overrides: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.overrides = dict(overrides or {})
        self._base: config.Config | None = None
        self._config: config.Config | None = None

    @property
    def is_default(self) -> bool:
        return self.name is None and not self.overrides

    def config(self) -> config.Config:
        """This process's settings with the target's backend and overrides (validated:
        an unknown setting or a bad value raises ConfigError naming it)."""
        base = config.get_config()
        if self.is_default:
            return base
        with _lock:
            if self._base is not base or self._config is None:
                settings = dict(self.overrides)
                if self.name is not None:
                    settings["backend"] = self.name
                self._config = config.overlay(base, settings, "get_context()")
                self._base = base
            return self._config

    def key(self) -> tuple[str, ...] | None:
        """What backend instances are cached by (None: the default instance)."""
        if not self.overrides:
            return None
        cfg = self.config()
        return tuple(f"{k}={cfg.values[k]!r}" for k in sorted(self.overrides))

    def backend(self) -> Backend:
        """The backend instance of this target (created on first use)."""
        cfg = self.config()
        return registry.get_backend(cfg.backend, cfg.as_dict(), self.key())

    def listen_host(self) -> str:
        """The address this process's hub for the target's jobs binds: the
        ``listen_address`` setting, else the address the backend says its jobs can
        reach."""
        cfg = self.config()
        if cfg.listen_address:
            return str(cfg.listen_address)
        return self.backend().listen_address()

    def hub(self) -> transport.Hub:
        """The hub the target's jobs connect to, created on first use. In a program's
        main process, the backend is told then that jobs running :func:`job_command`
        are coming (:meth:`Backend.expect_jobs`)."""
        host = self.listen_host()
        if not _is_job:
            backend = self.backend()
            with _lock:  # once per backend instance (targets may share one)
                first = _told.get(id(backend)) is not backend
                _told[id(backend)] = backend
            if first:
                # before any job exists: `fiber clean` tells this run's jobs from
                # orphans by the record (fiber.runtime.runs)
                runs.register(run_id(), backend.name)
                backend.expect_jobs(job_command(self.config(), backend))
        return transport.get_hub(host)

    def resources(self, *requests: Resources | Mapping[str, Any] | None) -> Resources:
        """The settings' requests (``cpu``, ``memory``, ``gpu``) with ``requests`` on
        top, later ones winning, checked by the backend
        (:meth:`Backend.check_resources`: a request it cannot honour raises
        ConfigError here, before any job starts)."""
        cfg = self.config()
        merged = Resources(cpu=cfg.cpu, memory=cfg.memory, gpu=cfg.gpu)
        for request in requests:
            if request:
                merged = merged.merged(Resources.of(request))
        self.backend().check_resources(merged)
        return merged

    def __repr__(self) -> str:
        return f"Target({self.name!r}, {self.overrides!r})"


_targets: dict[tuple[str | None, str], Target] = {}
# backend instances told that jobs are coming (Backend.expect_jobs), by id
_told: dict[int, Backend] = {}
_default_target = Target()


@runtime_checkable
class Carrier(Protocol):
    """What carries a target: a fiber context (:class:`fiber.context.BaseContext`)."""

    def run_target(self) -> Target:
        """The target of the jobs and objects this carrier makes."""


def target(name: str | None = None, overrides: Mapping[str, Any] | None = None) -> Target:
    """The target of backend ``name`` with setting ``overrides`` (one per name and
    overrides in a process; the overrides are validated here). No name and no
    overrides: the default target."""
    overrides = dict(overrides or {})
    if name is None and not overrides:
        return _default_target
    key = (name, repr(sorted(overrides.items())))
    with _lock:
        found = _targets.get(key)
    if found is not None:
        return found
    made = Target(name, overrides)
    made.config()  # validate before it is kept
    with _lock:
        return _targets.setdefault(key, made)


# whether instances of a type are carriers (a runtime-checkable isinstance costs
# about 10 us on Python 3.11: once per type, not per queue made)
_carrier_types: dict[type, bool] = {}


def carries(ctx: object) -> TypeGuard[Carrier]:
    """Whether ``ctx`` is a :class:`Carrier` (a fiber context), not None nor another
    object (multiprocessing's contexts)."""
    kind = type(ctx)
    known = _carrier_types.get(kind)
    if known is None:
        known = _carrier_types[kind] = isinstance(ctx, Carrier)
    return known


def of(ctx: object) -> Target:
    """The target of the context ``ctx``: the one a fiber context carries, else (None,
    or a context of multiprocessing's) the default target."""
    if ctx is not None and carries(ctx):
        return ctx.run_target()
    return _default_target


def backend() -> Backend:
    """The default target's backend (the one the ``backend`` setting selects)."""
    return _default_target.backend()


def listen_host() -> str:
    """The address this process's hub binds for the default target's jobs."""
    return _default_target.listen_host()


def hub() -> transport.Hub:
    """This process's hub for the default target's jobs, created on first use."""
    return _default_target.hub()
