"""The hook specification of fiber: everything a backend plugin implements.

A backend plugin is a small package with an entry point in the group ``fiber`` that
names a module (or object) implementing some of the hooks below, marked with
:data:`hookimpl`. For example, in the plugin's ``pyproject.toml``::

    [project.entry-points.fiber]
    mycluster = "fiber_mycluster.plugin"

and in ``fiber_mycluster/plugin.py``::

    from fiber.backend import ConfigOption, hookimpl
    from .backend import MyClusterBackend

    @hookimpl
    def fiber_backends() -> dict[str, type[MyClusterBackend]]:
        return {"mycluster": MyClusterBackend}

    @hookimpl
    def fiber_config_options() -> list[ConfigOption]:
        return [ConfigOption("mycluster_queue", str, "default", "queue to submit to")]

The backend class implements :class:`fiber.backend.Backend` (create_job, status,
terminate, and the attribute ``secrets_delivery``, which says how a job gets the run's
secret, ``JobSpec.secrets``, without it showing in the cluster's description of the job:
:mod:`fiber.backend.secrets`; optionally poll, create_jobs, terminate_jobs, wait, logs,
listen_address, expect_jobs, release, list_jobs, close; and it declares in
``capabilities`` the optional parts it really implements, which
``fiber.backend.CAPABILITIES`` lists) on the types of :mod:`fiber.backend.job` (JobSpec, Job, JobStatus,
JobState). The package :mod:`fiber.backend` exports all of them: it is the whole public
contract, and a plugin never imports anything else from fiber. Its errors tell the core
what to do: :class:`~fiber.backend.TransientBackendError` (and
:class:`~fiber.backend.ClusterUnreachableError`) are retried with backoff for up to the
``backend_retry_timeout`` setting, :class:`~fiber.backend.JobCreationError` fails at
once (see :mod:`fiber.backend.base`).
:mod:`fiber.testing.contract` is a test suite every backend runs against itself.

A plugin module is imported by every fiber process that reads its settings, jobs
included: keep it light, and import the cluster's client library only in the factory
(as above). The built-in ``local`` backend (:mod:`fiber.backend.local`) registers
through these same hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pluggy

from fiber.backend.base import Backend
from fiber.backend.options import ConfigOption

PROJECT_NAME = "fiber"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: decorator for a plugin's hook implementations
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

BackendFactory = Callable[[Mapping[str, Any]], Backend]


@hookspec
def fiber_backends() -> Mapping[str, BackendFactory]:
    """Return the backends this plugin provides, as ``{name: factory}``.

    ``factory(options)`` is called at most once per process, the first time the
    backend is used, with the effective settings (a mapping of every declared option
    name to its typed value); usually the factory is the :class:`Backend` subclass.
    Backend names are unique across plugins: a second plugin claiming a name is an
    error that names both plugins.
    """
    raise NotImplementedError  # a specification: pluggy calls the plugins' implementations


@hookspec
def fiber_config_options() -> Sequence[ConfigOption]:
    """Return the settings this plugin reads, so that they can be set by code,
    environment (``FIBER_<NAME>``) or ``.fiberconfig``, are parsed and validated,
    and are shown by ``fiber config``. Prefix the names with the backend's name
    (``docker_network``, ``slurm_partition``)."""
    raise NotImplementedError  # a specification: pluggy calls the plugins' implementations
