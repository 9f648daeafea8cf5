"""The hook specification of fiber: everything a backend plugin implements.

A backend plugin is a small package with an entry point in the group ``fiber`` that
names a :class:`fiber.backend.Plugin` object, its declaration as data. For example,
in the plugin's ``pyproject.toml``::

    [project.entry-points.fiber]
    mycluster = "fiber_mycluster.plugin:plugin"

and in ``fiber_mycluster/plugin.py``::

    from fiber.backend import ConfigOption, Plugin

    plugin = Plugin(
        package="fiber-mycluster",
        contract=1,
        backends={"mycluster": "fiber_mycluster.backend:MyClusterBackend"},
        options=[ConfigOption("mycluster_queue", str, "default", "queue to submit to")],
    )

The registry calls the one hook below, ``fiber_plugin``, through pluggy; ``Plugin``
implements it.

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
included: keep it light; the backend's module (and the cluster's client library) is
imported by the registry from the dotted path, the first time the backend is used. The
built-in ``local`` backend (:mod:`fiber.backend.local`) registers the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pluggy

from fiber.backend.base import Backend
from fiber.backend.plugin import PROJECT_NAME, Plugin, hookimpl

__all__ = ["PROJECT_NAME", "BackendFactory", "Plugin", "fiber_plugin", "hookimpl",
           "hookspec"]

hookspec = pluggy.HookspecMarker(PROJECT_NAME)

BackendFactory = Callable[[Mapping[str, Any]], Backend]


@hookspec
def fiber_plugin() -> Plugin:
    """Return the plugin's declaration: its contract version, its backends (names to
    dotted paths, imported when used) and its settings. :class:`fiber.backend.Plugin`
    implements this hook itself: an entry point names a ``Plugin`` object and writes
    no hook of its own.

    Backend names are unique across plugins: a second plugin claiming a name is an
    error that names both plugins. The settings (``options``, :class:`ConfigOption`)
    can be set by code, environment (``FIBER_<NAME>``) or ``.fiberconfig``, are parsed
    and validated, and are shown by ``fiber config``; prefix their names with the
    backend's name (``docker_network``, ``slurm_partition``).
    """
    raise NotImplementedError  # a specification: pluggy calls the plugins' implementations
