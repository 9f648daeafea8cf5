"""The ``fiber`` command line.

``fiber backends``       installed backends, with the plugin packages providing them
``fiber config``         effective settings and where each comes from
``fiber run -- CMD ...`` run CMD itself as a job on the selected backend, stream its
                         output, exit with its exit code; Ctrl-C terminates the job
``fiber jobs``           jobs of the selected backend that carry fiber's labels
``fiber clean``          terminate and remove them (``--run ID`` for one run only)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from types import FrameType
from typing import Any

from fiber.backend import Backend, Job, JobSpec, JobState, registry
from fiber.errors import BackendError, BackendNotFoundError, ConfigError
from fiber.runtime import config


def _cmd_backends(args: argparse.Namespace) -> int:
    found = registry.backends()
    width = max((len(n) for n in found), default=7)
    for name in sorted(found):
        info = found[name]
        print(f"{name:<{width}}  {info.package} {info.version}")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    cfg = config.get_config()
    width = max(len(n) for n in cfg.values)
    for name in sorted(cfg.values):
        option = cfg.options[name]
        print(f"{name:<{width}}  {cfg.values[name]!r:<24} ({cfg.sources[name]}; "
              f"{option.env_var}) {option.help}")
    return 0


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    chosen = {k: getattr(args, k) for k in ("backend", "cpu", "memory", "gpu", "image")
              if getattr(args, k, None) is not None}
    return config.init(**chosen).as_dict() if chosen else config.get_config().as_dict()


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("fiber run: give a command after --, e.g. fiber run -- python main.py",
              file=sys.stderr)
        return 2
    settings = _settings(args)
    cfg = config.get_config()
    backend = registry.get_backend(settings["backend"], settings)
    run = uuid.uuid4().hex[:12]
    env = cfg.child_env()
    env["FIBER_BACKEND"] = settings["backend"]
    env["_FIBER_RUN"] = run
    env["PYTHONUNBUFFERED"] = "1"
    spec = JobSpec(command=command, env=env, cwd=os.getcwd(), image=settings.get("image"),
                   cpu=settings.get("cpu"), memory=settings.get("memory"),
                   gpu=settings.get("gpu"), name="fiber-run",
                   labels={"fiber.run": run, "fiber.parent": "cli"})
    job = backend.create_job(spec)
    interrupted = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        interrupted = True
        backend.terminate(job)

    previous = signal.signal(signal.SIGINT, stop)
    shown = 0
    try:
        while True:
            status = backend.wait(job, 0.2)
            logs = backend.logs(job)
            if len(logs) > shown:
                sys.stdout.write(logs[shown:])
                sys.stdout.flush()
                shown = len(logs)
            if status is not None:
                break
        # the last lines may reach the cluster's log store a moment later
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            logs = backend.logs(job)
            if len(logs) > shown:
                sys.stdout.write(logs[shown:])
                shown = len(logs)
                continue
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, previous)
        backend.release(job)
    if interrupted:
        return 130
    if status.state is JobState.SUCCEEDED:
        return 0
    code = status.exitcode if status.exitcode is not None else 1
    return 128 - code if code < 0 else code


def _matching_jobs(args: argparse.Namespace) -> tuple[Backend, list[Job]]:
    settings = _settings(args)
    backend = registry.get_backend(settings["backend"], settings)
    labels = {"fiber.run": args.run} if args.run else {}
    return backend, [j for j in backend.list_jobs(labels) if "fiber.run" in j.spec.labels]


def _cmd_jobs(args: argparse.Namespace) -> int:
    backend, jobs = _matching_jobs(args)
    for job in jobs:
        status = backend.status(job)
        print(f"{job.id}  {status.state.value:<9}  run={job.spec.labels.get('fiber.run')}  "
              f"{job.spec.name}")
    return 0


def _cmd_clean(args: argparse.Namespace) -> int:
    backend, jobs = _matching_jobs(args)
    for job in jobs:
        backend.terminate(job, force=True)
        backend.wait(job, 30)
        backend.release(job)
        print(f"removed {job.id}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fiber", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command_name", required=True)
    sub.add_parser("backends", help="list installed backends").set_defaults(func=_cmd_backends)
    sub.add_parser("config", help="show effective settings").set_defaults(func=_cmd_config)
    run = sub.add_parser("run", help="run a command as a job on the backend")
    for p in (run,):
        p.add_argument("--backend")
        p.add_argument("--image")
        p.add_argument("--cpu", type=float)
        p.add_argument("--memory")
        p.add_argument("--gpu", type=int)
    run.add_argument("command", nargs=argparse.REMAINDER)
    run.set_defaults(func=_cmd_run)
    for name, func, text in (("jobs", _cmd_jobs, "list fiber's jobs on the backend"),
                             ("clean", _cmd_clean, "terminate and remove fiber's jobs")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--backend")
        p.add_argument("--run", help="only the jobs of this run id")
        p.set_defaults(func=func)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # noqa: BLE001 - a CLI reports errors as messages
        if isinstance(exc, (BackendError, BackendNotFoundError, ConfigError)):
            print(f"fiber: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
