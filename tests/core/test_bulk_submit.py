"""Creating jobs in bulk (fiber.runtime.submit): the creations that arrive together
are one ``create_jobs`` call of a backend that declares ``bulk``; each requester gets
its own job or its own error, and retries its own transient errors.

The backend is the test plugin's ``faulty_bulk`` (tests/fault_plugin): the real local
backend, whose jobs are real subprocesses, with a ``create_jobs`` that records the size
of each call and refuses the specs marked so.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from fiber.backend.job import JobSpec
from fiber.errors import JobCreationError
from fiber.runtime import submit

FAULT_PLUGIN = Path(__file__).parent.parent / "fault_plugin"


def bulk_env(**variables: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(FAULT_PLUGIN), os.environ.get("PYTHONPATH"))
                           if p)
    return {"PYTHONPATH": path, "FIBER_BACKEND": "faulty_bulk", **variables}


@pytest.fixture
def faulty(monkeypatch):
    monkeypatch.syspath_prepend(str(FAULT_PLUGIN))
    import fiber_faulty

    fiber_faulty.bulk_calls.clear()
    return fiber_faulty


def _create_together(backend, specs):
    """Create ``specs`` from one thread each, announced as a group; each one's job
    or exception, in order."""
    outcomes: list = [None] * len(specs)
    submit.expect(backend, len(specs))

    def one(index):
        try:
            outcomes[index] = submit.create(backend, specs[index])
        except Exception as exc:  # noqa: BLE001 - checked by the test
            outcomes[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(specs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def _spec(index: int, **env: str) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", f"raise SystemExit({index % 3})"],
                   env=dict(env), name=f"bulk-{index}")


def test_a_group_is_one_call_and_each_gets_its_own_job(faulty):
    """12 creations announced together: one create_jobs call of 12; each thread gets
    the job of its own spec (its exit status tells it apart)."""
    backend = faulty.FaultyBulkBackend({"local_start_method": "spawn"})
    try:
        outcomes = _create_together(backend, [_spec(i) for i in range(12)])
        assert faulty.bulk_calls == [12]
        for index, job in enumerate(outcomes):
            assert job.spec.name == f"bulk-{index}"
            status = backend.wait(job, 30)
            assert status is not None and status.exitcode == index % 3
    finally:
        backend.close()


def test_per_spec_errors_reach_their_own_requester(faulty):
    """Two specs of a group are refused: their requesters get the JobCreationError,
    the other requesters of the same call get their jobs."""
    backend = faulty.FaultyBulkBackend({"local_start_method": "spawn"})
    try:
        specs = [_spec(i, **({"FAULTY_REFUSE": "1"} if i in (2, 5) else {}))
                 for i in range(8)]
        outcomes = _create_together(backend, specs)
        assert faulty.bulk_calls == [8]
        for index, outcome in enumerate(outcomes):
            if index in (2, 5):
                assert isinstance(outcome, JobCreationError)
                assert f"bulk-{index} refused" in str(outcome)
            else:
                assert outcome.spec.name == f"bulk-{index}"
                assert backend.wait(outcome, 30) is not None
    finally:
        backend.close()


def test_requests_during_a_call_wait_for_the_next(faulty, monkeypatch):
    """Creations that arrive while a call is in flight are gathered into the next
    call, not one call each."""
    backend = faulty.FaultyBulkBackend({"local_start_method": "spawn"})
    entered, release = threading.Event(), threading.Event()
    real = type(backend).create_jobs

    def slow_first(self, specs):
        if not entered.is_set():
            entered.set()
            release.wait(30)
        return real(self, specs)

    monkeypatch.setattr(type(backend), "create_jobs", slow_first)
    try:
        first: list = []
        leader = threading.Thread(target=lambda: first.append(
            submit.create(backend, _spec(0))))
        leader.start()
        assert entered.wait(30)
        waiting = [threading.Thread(target=submit.create, args=(backend, _spec(i)))
                   for i in range(1, 7)]
        for thread in waiting:
            thread.start()
        # private read: only the submitter's queue shows the six creations gathered behind the
        # leader
        while len(submit.submitter(backend)._pending) < 6:
            threading.Event().wait(0.01)
        release.set()
        for thread in [leader, *waiting]:
            thread.join(60)
        assert faulty.bulk_calls == [1, 6]
    finally:
        backend.close()


def test_a_backend_without_bulk_is_called_per_job(faulty):
    """faulty (no bulk): create_job per creation, no submitter made."""
    backend = faulty.FaultyBackend({"local_start_method": "spawn"})
    try:
        job = submit.create(backend, _spec(0))
        assert backend.wait(job, 30) is not None
        assert faulty.bulk_calls == []
        # that no submitter was made for a backend without bulk
        assert submit.submitter.get(backend) is None
    finally:
        backend.close()


POOL = """
import fiber

def square(x):
    return x * x

if __name__ == "__main__":
    with fiber.Pool(8) as pool:
        print("result", pool.map(square, range(40)) == [x * x for x in range(40)])
"""


def test_pool_starts_its_workers_with_one_call(run_script, tmp_path):
    """faulty_bulk: Pool(8) starts its 8 workers with one create_jobs call."""
    calls = tmp_path / "calls"
    result = run_script(POOL, env=bulk_env(FAULTY_BULK_CALLS_FILE=str(calls)))
    assert result.returncode == 0, result.stderr
    assert "result True" in result.stdout, result.stdout + result.stderr
    assert calls.read_text().split() == ["8"]


SLOW_POOL = """
import time
import fiber

def slow(x):
    time.sleep(0.1)
    return x * x

if __name__ == "__main__":
    with fiber.Pool(8) as pool:
        print("result", pool.map(slow, range(80), chunksize=1) == [x * x for x in range(80)])
"""


def test_pool_retries_transient_errors_per_worker(run_script, tmp_path):
    """faulty_bulk: the first 3 creations of the group fail transiently: the pool's
    first call is of 8, the 3 workers retry (later calls, while the map, 1 s at least,
    runs), the map completes, and the outage is one warning."""
    calls = tmp_path / "calls"
    result = run_script(SLOW_POOL, env=bulk_env(FAULTY_BULK_CALLS_FILE=str(calls),
                                           FAULTY_CREATE_TRANSIENT="3"))
    assert result.returncode == 0, result.stderr
    assert "result True" in result.stdout, result.stdout + result.stderr
    sizes = [int(n) for n in calls.read_text().split()]
    assert sizes[0] == 8 and sum(sizes[1:]) >= 3, sizes
    warnings = [line for line in result.stderr.splitlines()
                if "failed to create a job" in line]
    assert len(warnings) == 1 and "503" in warnings[0], result.stderr
