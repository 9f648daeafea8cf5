"""Fixtures of the slurm backend's tests: they run against the real test cluster that
``pytest --fiber-backend slurm`` starts (tests/engines/slurm.py) and are skipped otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from fiber.backend.job import JobSpec
from fiber_slurm.backend import SlurmBackend
from fiber_slurm.options import OPTIONS


@pytest.fixture(scope="session")
def slurm_cluster(fiber_engine) -> dict[str, str]:
    if fiber_engine["backend"] != "slurm":
        pytest.skip("the slurm tests need the test cluster: run pytest --fiber-backend slurm")
    return fiber_engine


def slurm_options(**overrides) -> dict:
    """The backend's typed settings from the environment (FIBER_SLURM_*), as fiber's
    configuration would compute them, with ``overrides``."""
    options = {}
    for option in OPTIONS:
        raw = os.environ.get(option.env_var)
        options[option.name] = option.convert(raw, option.env_var) if raw is not None \
            else option.default
    options.update(overrides)
    return options


@pytest.fixture
def make_backend(slurm_cluster) -> Iterator:
    made: list[SlurmBackend] = []

    def make(**overrides) -> SlurmBackend:
        backend = SlurmBackend(slurm_options(**overrides))
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make_backend) -> SlurmBackend:
    return make_backend()


@pytest.fixture
def run_id() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def squeue_live(slurm_cluster):
    """``squeue_live(job_name)``: ids of the live (pending, running, completing) jobs
    named ``job_name``, straight from squeue."""

    def live(job_name: str) -> list[str]:
        done = subprocess.run(["squeue", "-h", "-n", job_name, "-o", "%i"],
                              capture_output=True, text=True, check=True)
        return done.stdout.split()

    return live


@pytest.fixture(scope="session")
def time_limited_job(slurm_cluster) -> Iterator[dict]:
    """A job with Slurm's shortest time limit (one minute), submitted when an early test
    first asks for it (test_bad_input.py) and checked by a late one (test_time_limit.py):
    the minute it must run overlaps the tests in between. Ended and released at the end
    of the session if the late test did not."""
    backend = SlurmBackend(slurm_options(slurm_time="1"))
    job = backend.create_job(JobSpec(
        command=[sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        name="time-limit", labels={"fiber.run": "t" + uuid.uuid4().hex[:10],
                                   "fiber.parent": "test"}))
    state = {"backend": backend, "job": job, "created": time.monotonic(), "released": False}
    try:
        yield state
    finally:
        if not state["released"]:
            backend.terminate(job, force=True)
            backend.release(job)
        backend.close()
