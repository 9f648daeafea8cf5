"""The example backend and its hook implementations."""

from __future__ import annotations

import os
import subprocess

from fiber.backend import (
    Backend,
    ConfigOption,
    Job,
    JobCreationError,
    JobSpec,
    JobState,
    JobStatus,
    hookimpl,
)


class ExampleBackend(Backend):
    name = "example"
    poll_interval = 0.1
    # jobs are this user's subprocesses: their environment is readable only by this
    # user and root, so the core may put the run's secret there (fiber.backend.secrets)
    secrets_delivery = "env"

    def create_job(self, spec: JobSpec) -> Job:
        env = {**os.environ, **spec.env, "EXAMPLE_JOB_MARKER": self.options["example_marker"]}
        try:
            proc = subprocess.Popen(spec.command, env=env, cwd=spec.cwd)
        except OSError as exc:
            raise JobCreationError(str(exc)) from exc
        return Job(id=str(proc.pid), backend=self.name, spec=spec, handle=proc)

    def status(self, job: Job) -> JobStatus:
        code = job.handle.poll()
        if code is None:
            return JobStatus(JobState.RUNNING)
        return JobStatus(JobState.SUCCEEDED if code == 0 else JobState.FAILED, code)

    def terminate(self, job: Job, force: bool = False) -> None:
        if job.handle.poll() is None:
            (job.handle.kill if force else job.handle.terminate)()


@hookimpl
def fiber_backends():
    return {"example": ExampleBackend}


@hookimpl
def fiber_config_options():
    return [ConfigOption("example_marker", str, "example-default", "value put in each job")]
