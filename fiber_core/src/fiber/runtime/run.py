"""This process's place in a run: the run's id, whether this process is a job, the
backend it creates jobs on, the address it listens on and its hub.

The wire below knows nothing of settings or backends: what it needs from here (the
host to listen on) is passed to it by :func:`hub`.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid

from fiber.backend import Backend, registry
from fiber.runtime import config
from fiber.wire import transport

__all__ = ["run_id", "is_job", "backend", "listen_host", "hub",
           "check_not_importing_main"]

RUN_ENV = "_FIBER_RUN"
#: the module every job runs (``python -m BOOTSTRAP``)
BOOTSTRAP = "fiber.runtime.bootstrap"

_lock = threading.Lock()
_is_job = False  # set by the bootstrap of a job
_importing_main = False  # set by the bootstrap while the job imports its parent's main
_expected = False  # the backend was told that jobs are coming

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


def job_command() -> list[str]:
    """The command every job of this process runs (``python -m BOOTSTRAP``, with the
    ``python`` setting's interpreter)."""
    return [config.get_config().python or sys.executable, "-m", BOOTSTRAP]


def backend() -> Backend:
    """The backend selected by the settings (created on first use)."""
    cfg = config.get_config()
    return registry.get_backend(cfg.backend, cfg.as_dict())


def listen_host() -> str:
    """The address this process's hub binds: the ``listen_address`` setting, else the
    address the selected backend says its jobs can reach."""
    cfg = config.get_config()
    if cfg.listen_address:
        return str(cfg.listen_address)
    return backend().listen_address()


def hub() -> transport.Hub:
    """This process's hub, created on first use. In a program's main process, the
    backend is told then that jobs running :func:`job_command` are coming
    (:meth:`Backend.expect_jobs`)."""
    global _expected
    host = listen_host()
    if not _is_job and not _expected:
        with _lock:
            first, _expected = not _expected, True
        if first:
            backend().expect_jobs(job_command())
    return transport.get_hub(host)
