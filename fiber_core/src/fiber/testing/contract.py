"""The backend contract suite: tests every fiber backend must pass against its real
cluster.

Use it from a plugin's tests by subclassing :class:`BackendContract` and providing a
``backend`` fixture (a ready :class:`fiber.backend.Backend` instance)::

    import pytest
    from fiber.testing.contract import BackendContract

    class TestMyClusterContract(BackendContract):
        @pytest.fixture
        def backend(self):
            b = MyClusterBackend(options)
            yield b
            b.close()

A backend declares the optional parts of the contract it implements in
``Backend.capabilities`` (``fiber.backend.CAPABILITIES`` lists them); a test of an
undeclared capability is skipped, and the skip says which capability was missing.

Optional fixtures to override: ``python`` (the Python executable inside jobs,
default ``sys.executable``), ``job_timeout`` (seconds a short job may take from
submission to end, default 60), ``base_spec`` (extra JobSpec fields such as an image)
and ``cluster_job_ids`` (a callable returning the ids of every job the cluster still
holds with the test's labels; by default ``backend.list_jobs``, and the test that needs
it is skipped when the backend does not declare ``list_jobs``).
"""

from __future__ import annotations

import hashlib
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fiber.backend import Backend, Job, JobCreationError, JobSpec, JobState, JobStatus
from fiber.backend.secrets import DELIVERIES, for_backend

#: the ``submit`` fixture: ``submit(code, **JobSpec fields)`` runs ``python -c code``
Submit = Callable[..., Job]


def require(backend: Backend, capability: str) -> None:
    """Skip the calling test unless ``backend`` declares ``capability``."""
    if capability not in backend.capabilities:
        pytest.skip(f"the {backend.name} backend does not declare the {capability!r} "
                    "capability (Backend.capabilities)")


class BackendContract:
    """Subclass me; see the module docstring."""

    # -- fixtures a plugin may override ------------------------------------------
    @pytest.fixture
    def python(self) -> str:
        return sys.executable

    @pytest.fixture
    def job_timeout(self) -> float:
        return 60.0

    @pytest.fixture
    def base_spec(self) -> JobSpec:
        return JobSpec(command=[])

    @pytest.fixture
    def run_labels(self) -> dict[str, str]:
        return {"fiber.run": "contract-" + uuid.uuid4().hex[:8], "fiber.parent": "contract"}

    @pytest.fixture
    def cluster_job_ids(self, backend: Backend,
                        run_labels: dict[str, str]) -> Callable[[], set[str]]:
        require(backend, "list_jobs")
        return lambda: {job.id for job in backend.list_jobs(run_labels)}

    @pytest.fixture
    def submit(self, backend: Backend, python: str, base_spec: JobSpec,
               run_labels: dict[str, str]) -> Iterator[Submit]:
        created: list[Job] = []

        def submit(code: str, **fields: Any) -> Job:
            spec = replace(
                base_spec,
                command=[python, "-c", code],
                name=fields.pop("name", "contract-job"),
                labels={**base_spec.labels, **run_labels},
                env={**base_spec.env, **fields.pop("env", {})},
                **fields,
            )
            # as the core does: secrets are merged into env for a backend that says
            # its jobs' environments are private, refused for one that says nothing
            job = backend.create_job(for_backend(backend, spec))
            created.append(job)
            return job

        yield submit
        for job in created:
            try:
                backend.terminate(job, force=True)
                backend.wait(job, 30)
            finally:
                backend.release(job)

    # -- the contract ------------------------------------------------------------
    def _wait(self, backend: Backend, job: Job, timeout: float) -> JobStatus:
        status = backend.wait(job, timeout)
        assert status is not None, f"job {job.id} did not end within {timeout}s"
        assert status.is_final
        return status

    def test_success_has_exit_code_zero(self, backend: Backend, submit: Submit,
                                        job_timeout: float) -> None:
        job = submit("print('hello')")
        assert isinstance(job.id, str) and job.id
        status = self._wait(backend, job, job_timeout)
        assert status.state is JobState.SUCCEEDED
        assert status.exitcode == 0
        assert backend.status(job).state is JobState.SUCCEEDED

    def test_failure_reports_exit_code(self, backend: Backend, submit: Submit,
                                       job_timeout: float) -> None:
        job = submit("import sys; sys.exit(3)")
        status = self._wait(backend, job, job_timeout)
        assert status.state is JobState.FAILED
        assert status.exitcode == 3

    def test_killed_by_signal_is_negative(self, backend: Backend, submit: Submit,
                                          job_timeout: float) -> None:
        job = submit("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        status = self._wait(backend, job, job_timeout)
        assert status.state is JobState.FAILED
        assert status.exitcode == -9

    def test_env_and_logs(self, backend: Backend, submit: Submit, job_timeout: float) -> None:
        require(backend, "logs")
        job = submit(
            "import os, sys; print('out', os.environ['CONTRACT_VALUE'], flush=True); "
            "print('err-line', file=sys.stderr, flush=True)",
            env={"CONTRACT_VALUE": "x42y"},
        )
        self._wait(backend, job, job_timeout)
        deadline = time.monotonic() + 10
        logs = backend.logs(job)
        while ("x42y" not in logs or "err-line" not in logs) and time.monotonic() < deadline:
            time.sleep(0.2)
            logs = backend.logs(job)
        assert "out x42y" in logs
        assert "err-line" in logs

    def test_secrets_reach_the_job(self, backend: Backend, submit: Submit,
                                   job_timeout: float) -> None:
        """``JobSpec.secrets`` become environment variables of the job (once the job
        side of :mod:`fiber.backend.secrets` ran, as fiber's bootstrap does first);
        the backend must declare ``secrets_delivery``. The job says by its exit code
        whether it got the secret (every backend reports exit codes); that the secret
        never shows in the job's logs is checked where the backend declares ``logs``."""
        assert backend.secrets_delivery in DELIVERIES, (
            f"the backend's secrets_delivery is {backend.secrets_delivery!r}: declare how "
            "it delivers JobSpec.secrets (fiber.backend.secrets)")
        secret = uuid.uuid4().hex
        digest = hashlib.sha256(secret.encode()).hexdigest()
        job = submit(
            "import hashlib, os; from fiber.backend import load_secrets; load_secrets(); "
            "v = os.environ.get('CONTRACT_SECRET', ''); "
            f"ok = hashlib.sha256(v.encode()).hexdigest() == {digest!r}; "
            "print('secret', ok, flush=True); raise SystemExit(0 if ok else 7)",
            secrets={"CONTRACT_SECRET": secret})
        status = self._wait(backend, job, job_timeout)
        assert status.exitcode == 0, (
            f"the job did not get JobSpec.secrets as its environment (exit code "
            f"{status.exitcode}; 7: CONTRACT_SECRET missing or different)")
        if "logs" not in backend.capabilities:
            return  # the rest reads the job's logs, an optional capability
        deadline = time.monotonic() + 10
        logs = backend.logs(job)
        while "secret " not in logs and time.monotonic() < deadline:
            time.sleep(0.2)
            logs = backend.logs(job)
        assert "secret True" in logs, logs
        assert secret not in logs

    def test_cwd_is_honoured(self, backend: Backend, submit: Submit, job_timeout: float,
                             tmp_path: Path) -> None:
        require(backend, "logs")
        job = submit("import os; print('cwd=' + os.getcwd(), flush=True)", cwd="/")
        self._wait(backend, job, job_timeout)
        assert "cwd=/\n" in backend.logs(job).replace("\r", "")

    def test_terminate_running_job(self, backend: Backend, submit: Submit,
                                   job_timeout: float) -> None:
        job = submit("import time; print('started', flush=True); time.sleep(600)")
        deadline = time.monotonic() + job_timeout
        while backend.status(job).state is not JobState.RUNNING:
            assert not backend.status(job).is_final, backend.status(job)
            assert time.monotonic() < deadline, "job never ran"
            time.sleep(0.1)
        assert backend.wait(job, 0.2) is None  # still running: wait times out
        started = time.monotonic()
        backend.terminate(job)
        status = self._wait(backend, job, 30)
        assert status.state in (JobState.CANCELLED, JobState.FAILED)
        assert time.monotonic() - started < 30
        backend.terminate(job)  # ending an ended job is not an error
        backend.terminate(job, force=True)

    def test_poll_many_jobs(self, backend: Backend, submit: Submit, job_timeout: float) -> None:
        jobs = [submit(f"import sys; sys.exit({i})") for i in range(3)]
        for job in jobs:
            self._wait(backend, job, job_timeout)
        statuses = backend.poll(jobs)
        assert set(statuses) == {job.id for job in jobs}
        assert [statuses[job.id].exitcode for job in jobs] == [0, 1, 2]

    def test_create_and_terminate_many(self, backend: Backend, submit: Submit,
                                       base_spec: JobSpec, python: str,
                                       run_labels: dict[str, str],
                                       job_timeout: float) -> None:
        """create_jobs starts every spec (in order) and terminate_jobs ends them all
        (whether the backend overrides them or uses the looping defaults)."""
        specs = [replace(base_spec, command=[python, "-c", "import time; time.sleep(600)"],
                         name=f"contract-many-{i}", labels={**base_spec.labels, **run_labels})
                 for i in range(3)]
        specs.append(replace(specs[0], command=["/nonexistent/fiber-contract-binary"],
                             name="contract-many-bad"))
        outcomes = backend.create_jobs(specs)
        assert len(outcomes) == len(specs)
        jobs = [job for job in outcomes if isinstance(job, Job)]
        try:
            assert [job.spec.name for job in jobs[:3]] == [spec.name for spec in specs[:3]]
            assert len({job.id for job in jobs}) == len(jobs)
            bad = outcomes[3]
            if isinstance(bad, Job):  # a backend that finds out later: the job fails
                status = self._wait(backend, bad, job_timeout)
                assert status.state is JobState.FAILED
            else:
                assert isinstance(bad, Exception) and str(bad)
            deadline = time.monotonic() + job_timeout
            while not all(backend.status(job).state is JobState.RUNNING
                          for job in jobs[:3]):
                assert time.monotonic() < deadline, "the jobs never ran"
                time.sleep(0.2)
            errors = backend.terminate_jobs(jobs[:3])
            assert errors == {}
            for job in jobs[:3]:
                status = self._wait(backend, job, 30)
                assert status.state in (JobState.CANCELLED, JobState.FAILED)
        finally:
            for job in jobs:
                backend.terminate(job, force=True)
                backend.wait(job, 30)
                backend.release(job)

    def test_list_and_release_leave_nothing(self, backend: Backend, submit: Submit,
                                            job_timeout: float,
                                            cluster_job_ids: Callable[[], set[str]]) -> None:
        job = submit("print('x')")
        assert job.id in cluster_job_ids()
        self._wait(backend, job, job_timeout)
        backend.release(job)
        deadline = time.monotonic() + 30
        while job.id in cluster_job_ids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job.id not in cluster_job_ids()
        backend.release(job)  # releasing twice is not an error

    def test_job_reaches_listen_address(self, backend: Backend, submit: Submit,
                                        job_timeout: float) -> None:
        address = backend.listen_address()
        assert isinstance(address, str) and address
        server = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        server.bind((address, 0))
        server.listen(1)
        server.settimeout(job_timeout)
        port = server.getsockname()[1]
        token = uuid.uuid4().hex
        received: list[bytes] = []

        def accept() -> None:
            try:
                conn, _ = server.accept()
                conn.settimeout(10)
                received.append(conn.recv(100))
                conn.close()
            except OSError:
                pass

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        host = f"[{address}]" if ":" in address else address
        job = submit(
            "import socket; s = socket.create_connection(("
            f"{host.strip('[]')!r}, {port}), 10); s.sendall({token!r}.encode()); s.close()"
        )
        self._wait(backend, job, job_timeout)
        thread.join(10)
        server.close()
        assert received == [token.encode()]

    def test_bad_command_is_an_error(self, backend: Backend, base_spec: JobSpec,
                                     run_labels: dict[str, str], job_timeout: float) -> None:
        spec = replace(base_spec, command=["/nonexistent/fiber-contract-binary"],
                       labels={**base_spec.labels, **run_labels}, name="contract-bad")
        try:
            job = backend.create_job(spec)
        except JobCreationError as exc:
            assert str(exc)
            return
        try:
            status = self._wait(backend, job, job_timeout)
            assert status.state is JobState.FAILED
            assert status.exitcode not in (0, None)
        finally:
            backend.release(job)
