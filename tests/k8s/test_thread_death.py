"""No thread of the kubernetes backend dies silently (issue #32), on the real test
cluster (tests/engines/kubernetes.py).

As in tests/core/test_thread_death.py, the only fake is the exception:
``_FIBER_TEST_THREAD_FAULT`` (fiber.threads.FAULT_ENV) names the kind of thread that
raises ``RuntimeError`` as its first act; it is read when a thread starts, so setting it
in this process's environment for one test injects it into that test's backend only.
"""

from __future__ import annotations

import logging
import sys
import time

from fiber import threads
from fiber.backend.job import JobSpec, JobState

LABELS = {"fiber.run": "k8s-thread-death", "fiber.parent": "pytest"}


def test_watch(make_backend, monkeypatch, caplog):
    """The pod watch dies (logged once, naming it): the backend stops trusting its
    cache and reads each status from the API server, so a job's wait still ends with
    the job's true final status, where a stale cache would show it running for ever."""
    backend = make_backend()
    monkeypatch.setenv(threads.FAULT_ENV, "fiber-k8s-watch")
    with caplog.at_level(logging.ERROR, logger="fiber"):
        job = backend.create_job(JobSpec(
            command=[sys.executable, "-c", "import sys; sys.exit(3)"], labels=dict(LABELS),
            name="watch-death"))
        try:
            began = time.monotonic()
            status = backend.wait(job, 90)
            assert status is not None and status.state is JobState.FAILED, status
            assert status.exitcode == 3, status
            assert time.monotonic() - began < 90
        finally:
            backend.terminate(job, force=True)
            backend.release(job)
    died = [r for r in caplog.records if "fiber thread fiber-k8s-watch died" in r.getMessage()]
    assert len(died) == 1, [r.getMessage() for r in caplog.records]
    # private read: the watch thread's state, which no API shows
    assert backend._watcher is not None and not backend._watcher.synced.is_set()
    assert "fiber-k8s-watch" in str(backend._watcher.error)
