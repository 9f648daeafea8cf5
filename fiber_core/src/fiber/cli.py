"""The ``fiber`` command line (``python -m fiber`` is the same program).

``fiber backends``       installed backends, with the plugin packages providing them,
                         and those that cannot be used, with why (``--strict``: exit 1
                         when there is one)
``fiber config``         effective settings and where each comes from
``fiber run -- CMD ...`` run CMD itself as a job on the selected backend, stream its
                         output, exit with its exit code; Ctrl-C terminates the job;
                         with ``--build``, in an image made for the program first
``fiber build [DIR]``    make the image of the program in DIR (its Dockerfile, or one
                         made for the launching environment), tag it by content, push
                         it to the image_registry setting, print its reference
``fiber jobs``           fiber's jobs on the selected backend, whichever process made them
``fiber clean``          end the jobs of ended programs (orphans) and remove what those
                         programs left on this machine; ``--run ID`` ends one run's
                         jobs, ``--all`` every job (after a question; ``--yes``)
``fiber top``            a live view of a running program's pools (:mod:`fiber.top`)
``fiber dashboard``      the same as a live web page (:mod:`fiber.dashboard`)
``fiber --version``      the versions of fiber-core and of the installed plugins

With no command it prints its help.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from types import FrameType
from typing import Any

from fiber._version import __version__
from fiber.backend import Backend, BuiltImage, ImageRequest, Job, JobSpec, JobState, registry
from fiber.errors import BackendError, BackendNotFoundError, ConfigError, ImageBuildError
from fiber.runtime import config, leftovers, runs

DESCRIPTION = """\
Run programs as fiber jobs and look after their jobs. A fiber program's processes
run as jobs on the backend its backend setting selects (FIBER_BACKEND, a
.fiberconfig file or fiber.init(); local by default); `fiber config` shows every
setting, `fiber COMMAND --help` what a command does."""

EPILOG = """examples:
  fiber run -- python main.py                 run main.py as a job (local backend)
  fiber run --backend docker --image img -- python main.py
  fiber run --backend kubernetes --build -- python main.py
                                              make main.py's image, push it, run it
  fiber build                                 only make (and push) the image
  fiber jobs                                  fiber's jobs on the selected backend
  fiber clean                                 end orphaned jobs, remove leftovers
  fiber clean --run 3f2a9c0d1e4b              end the jobs of one run
  fiber top                                   live view of a running program's pools
  fiber dashboard                             the same in a browser (prints its URL)
"""


def versions() -> list[str]:
    """``package version`` of fiber-core and of every installed plugin, with the
    backends each provides."""
    provided: dict[tuple[str, str], list[str]] = {}
    for name, info in sorted(registry.backends().items()):
        provided.setdefault((info.package, info.version), []).append(name)
    core = provided.pop(("fiber-core", __version__), [])
    lines = [f"fiber-core {__version__} (Python {sys.version.split()[0]}"
             + (f"; backend {', '.join(core)})" if core else ")")]
    for (package, version), names in sorted(provided.items()):
        lines.append(f"{package} {version} (backend {', '.join(names)})")
    for item in registry.broken():
        if item.entry_point:  # (not a name two plugins claim)
            lines.append(f"{item.package} {item.version} (broken: see `fiber backends`)")
    return lines


class _Version(argparse.Action):
    """``--version``: the plugins are looked up only when it is asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print("\n".join(versions()))
        parser.exit()


def _cmd_backends(args: argparse.Namespace) -> int:
    """One line per backend: its name, package and version; a backend that cannot be
    used (its plugin could not be loaded or declared, its class path does not resolve
    or its class does not implement the contract: each backend's module is imported
    to check it) ends its line with ``BROKEN:`` and the fault. Exit 0, or with
    ``--strict`` 1 when a backend is broken."""
    rows: list[tuple[str, str, str | None]] = []
    for name, info in registry.backends().items():
        rows.append((name, f"{info.package} {info.version}", registry.backend_fault(name)))
    for item in registry.broken():
        for name in item.backends:
            rows.append((name, f"{item.package} {item.version}", item.describe()))
    width = max((len(name) for name, _, _ in rows), default=7)
    for name, package, fault in sorted(rows, key=lambda row: row[0]):
        print(f"{name:<{width}}  {package}" + (f"  BROKEN: {fault}" if fault else ""))
    if args.strict and any(fault for _, _, fault in rows):
        return 1
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
    chosen = {k: getattr(args, k) for k in ("backend", "cpu", "memory", "gpu", "image",
                                            "image_registry")
              if getattr(args, k, None) is not None}
    return config.init(**chosen).as_dict() if chosen else config.get_config().as_dict()


def _show_new_output(backend: Backend, job: Job, shown: int) -> int:
    """Print what the job's log has beyond its first ``shown`` characters; returns the
    new length."""
    logs = backend.logs(job)
    if len(logs) > shown:
        sys.stdout.write(logs[shown:])
        sys.stdout.flush()
    return max(shown, len(logs))


def _image_backends() -> list[str]:
    """The installed backends whose jobs run in images (capability ``images``)."""
    names = []
    for name, info in sorted(registry.backends().items()):
        try:
            module_name, _, attribute = info.path.partition(":")
            target: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError):
            continue
        if "images" in getattr(target, "capabilities", ()):
            names.append(name)
    return names


def _build(directory: str, backend: Backend, settings: dict[str, Any]) -> BuiltImage:
    """Make the program's image for ``backend`` with the image builder (its progress
    on stderr)."""
    if "images" not in backend.capabilities:
        raise BackendError(
            f"the {backend.name} backend does not run its jobs in images, so there is no "
            f"image to build for it; backends that do: "
            f"{', '.join(_image_backends()) or 'none installed'}")
    path = os.path.abspath(directory)
    if not os.path.isdir(path):
        raise ImageBuildError(
            f"cannot build an image of {directory!r}: "
            + ("it is not a directory" if os.path.exists(path) else "no such directory")
            + " (give the program's code directory, which holds its main script)")
    packages = ["fiber-core"]
    plugin = registry.backends()[backend.name].package
    if plugin not in packages:
        packages.append(plugin)
    request = ImageRequest(directory=path, backend=backend.name, packages=tuple(packages),
                           registry=settings.get("image_registry"),
                           base=settings.get("image_base"))
    builder = registry.get_builder(settings.get("image_builder"), settings)
    try:
        return builder.build(request, lambda line: print(f"fiber: {line}", file=sys.stderr))
    finally:
        builder.close()


def _known_in_image(env: dict[str, str], backend: str) -> dict[str, str]:
    """The settings of ``env`` that fiber-core and the backend's plugin know: a made
    image holds those two (and the program's packages), and a setting of a plugin it
    lacks would be an unknown setting there (the image builder's own, docker_host for
    a kubernetes program, stays here)."""
    known = {option.env_var for option in config.CORE_OPTIONS}
    for plugin in registry.plugins():
        if backend in plugin.backends:
            known.update(option.env_var for option in plugin.options)
    return {name: value for name, value in env.items() if name in known}


def _cmd_build(args: argparse.Namespace) -> int:
    settings = _settings(args)
    backend = registry.get_backend(settings["backend"], settings)
    image = _build(args.directory, backend, settings)
    print(image.reference)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("fiber run: give a command after --, e.g. fiber run -- python main.py",
              file=sys.stderr)
        return 2
    settings = _settings(args)
    backend = registry.get_backend(settings["backend"], settings)
    cwd: str | None = os.getcwd()
    if args.build is not None:
        if args.image:
            print("fiber run: give either --image or --build, not both", file=sys.stderr)
            return 2
        built = _build(args.build, backend, settings)
        # the program and its children run from the image (the image setting in their
        # environment), in the image's working directory
        settings = config.init(image=built.reference, **built.settings).as_dict()
        cwd = None
    cfg = config.get_config()
    run = uuid.uuid4().hex[:12]
    env = cfg.child_env()
    if args.build is not None:
        env = _known_in_image(env, backend.name)
    env["FIBER_BACKEND"] = settings["backend"]
    env["_FIBER_RUN"] = run
    env["PYTHONUNBUFFERED"] = "1"
    spec = JobSpec(command=command, env=env, cwd=cwd, image=settings.get("image"),
                   cpu=settings.get("cpu"), memory=settings.get("memory"),
                   gpu=settings.get("gpu"), name="fiber-run",
                   labels={"fiber.run": run, "fiber.parent": "cli"})
    # this process is the run's main process until its job (the program) runs
    runs.register(run, backend.name)
    job = backend.create_job(spec)
    interrupted = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        interrupted = True
        backend.terminate(job)

    previous = signal.signal(signal.SIGINT, stop)
    shown = 0
    try:
        status = None
        while status is None:
            status = backend.wait(job, 0.2)
            shown = _show_new_output(backend, job, shown)
        # the end is known; a backend whose log store lags gets until its output has
        # not grown for logs_lag seconds (the local backend's log is complete: 0)
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < backend.logs_lag:
            time.sleep(min(0.1, backend.logs_lag))
            grown = _show_new_output(backend, job, shown)
            if grown > shown:
                shown, quiet_since = grown, time.monotonic()
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
    if "list_jobs" not in backend.capabilities:
        raise BackendError(
            f"the {backend.name} backend cannot list the jobs that other processes "
            f"created, so `fiber {args.command_name}` cannot see them; use the "
            "cluster's own tools")
    labels = {"fiber.run": args.run} if args.run else {}
    return backend, [j for j in backend.list_jobs(labels) if "fiber.run" in j.spec.labels]


def _none_found(backend: Backend, args: argparse.Namespace) -> str:
    which = f" of run {args.run}" if args.run else ""
    return f"no fiber jobs{which} on the {backend.name} backend"


def _by_run(jobs: list[Job]) -> dict[str, list[Job]]:
    found: dict[str, list[Job]] = {}
    for job in jobs:
        found.setdefault(job.spec.labels["fiber.run"], []).append(job)
    return found


def _run_states(backend: Backend, jobs: list[Job],
                records: list[runs.RunRecord]) -> dict[str, runs.State]:
    """Each run's state (:func:`fiber.runtime.runs.state`); a run whose program is the
    job of a ``fiber run`` (label ``fiber.parent=cli``) is live while that job runs,
    whatever became of the ``fiber run`` process."""
    states = {}
    for run, mine in _by_run(jobs).items():
        states[run] = runs.state(run, records)
        if states[run] == runs.ENDED and any(
                j.spec.labels.get("fiber.parent") == "cli"
                and backend.status(j).state in (JobState.PENDING, JobState.RUNNING)
                for j in mine):
            states[run] = runs.LIVE
    return states


def _ended_pids(records: list[runs.RunRecord], run: str | None) -> set[int] | None:
    """The pids of the ended main processes of ``run`` (what its leftovers name);
    None (everything ended) without a run."""
    if run is None:
        return None
    return {r.pid for r in records if r.run == run and r.here() and not r.alive()}


def _left_alone(states: dict[str, runs.State], jobs: list[Job]) -> str:
    counts = {run: len(mine) for run, mine in _by_run(jobs).items()}
    runs_text = ", ".join(
        f"{run} ({_plural(n, 'job')}"
        + ("" if states[run] == runs.LIVE else ", its program is not known on this "
           "machine: it may run elsewhere") + ")"
        for run, n in sorted(counts.items()))
    return (f"left alone {_plural(len(jobs), 'job')} of {_plural(len(counts), 'run')} "
            f"whose program is running or not known to have ended: {runs_text}. "
            "`fiber clean --run ID` ends one run's jobs, `fiber clean --all` every "
            "fiber job")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _cmd_jobs(args: argparse.Namespace) -> int:
    backend, jobs = _matching_jobs(args)
    if not jobs:
        print(_none_found(backend, args))
    for job in jobs:
        status = backend.status(job)
        print(f"{job.id}  {status.state.value:<9}  run={job.spec.labels.get('fiber.run')}  "
              f"{job.spec.name}")
    records = list(runs.read_all())
    states = _run_states(backend, jobs, records)
    orphans = [run for run, state in states.items() if state == runs.ENDED]
    if orphans:
        count = sum(len(m) for r, m in _by_run(jobs).items() if r in orphans)
        print(f"{_plural(count, 'job')} of ended programs (runs {', '.join(orphans)}): "
              "`fiber clean` ends them")
    found = leftovers.find(_ended_pids(records, args.run))
    if found:
        print(f"left by ended programs: {found.describe()}: `fiber clean` removes them")
    return 0


def _confirm(question: str) -> bool:
    try:
        answer = input(question + " [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _end(backend: Backend, jobs: list[Job]) -> list[Job]:
    """Kill and release ``jobs``; those that did not end."""
    failed = []
    for job in jobs:
        backend.terminate(job, force=True)
        if backend.wait(job, 30) is None:
            print(f"fiber clean: job {job.id} has not ended 30 s after it was killed",
                  file=sys.stderr)
            failed.append(job)
            continue
        backend.release(job)
        print(f"removed {job.id}")
    return failed


def _cmd_clean(args: argparse.Namespace) -> int:
    if args.all and not args.yes and not sys.stdin.isatty():
        print("fiber clean --all ends the jobs of running programs too and asks first, "
              "but there is no terminal to ask on: pass --yes to end them "
              "(fiber clean --all --yes), or end one run's jobs with --run ID",
              file=sys.stderr)
        return 2
    backend, jobs = _matching_jobs(args)
    records = list(runs.read_all())
    states = _run_states(backend, jobs, records)
    if args.run or args.all:
        chosen, kept = jobs, []
    else:  # only the orphans: jobs whose program is known to have ended
        chosen = [j for j in jobs if states[j.spec.labels["fiber.run"]] == runs.ENDED]
        kept = [j for j in jobs if j not in chosen]
    if args.all and chosen and not args.yes:
        live = [r for r, state in states.items() if state != runs.ENDED]
        if not _confirm(f"end {_plural(len(chosen), 'fiber job')} of "
                        f"{_plural(len(states), 'run')} on the {backend.name} backend, "
                        f"of which {_plural(len(live), 'run')} may still be running "
                        f"({', '.join(live) or 'none'})?"):
            print("nothing ended")
            return 1
    failed = _end(backend, chosen)
    if kept:
        print(_left_alone(states, kept))
    # what ended programs left on this machine
    removed = leftovers.remove(_ended_pids(records, args.run))
    if removed:
        print(f"removed what ended programs left: {removed.describe()}")
    if not jobs and not removed:
        print(_none_found(backend, args) + ": nothing to clean")
    # the records of ended runs none of whose jobs is left on this backend
    left_runs = {j.spec.labels["fiber.run"] for j in kept + failed}
    for record in records:
        if (record.backend == backend.name and record.run not in left_runs
                and (not args.run or record.run == args.run)
                and record.here() and runs.state(record.run, records) == runs.ENDED):
            runs.forget(record)
    return 1 if failed else 0


def _add_top(sub: Any) -> None:
    """The ``top`` command (:mod:`fiber.top`, imported when it runs: it needs the wire)."""
    p = sub.add_parser(
        "top", help="live view of a running fiber program's pools",
        description="Attach to a running fiber program of this user on this machine "
        "(one that has created a Pool) and show, per pool, its workers by state "
        "(pending in the cluster's queue, starting, running, lost, replaced), its tasks "
        "(queued, running, done, failed), throughput, the slowest running tasks and the "
        "last errors with their remote tracebacks, refreshed every second; press q (or "
        "Ctrl-C) to leave, and it leaves by itself when the program ends. It talks to "
        "the program over the program's own authenticated connection. Needs rich "
        "(pip install './fiber_core[top]' from a clone), except with --once --json.")
    p.add_argument("--pid", type=int,
                   help="the program to attach to (default: the only one, else the newest)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--json", action="store_true",
                   help="with --once: print the snapshot as JSON (for scripts)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between refreshes (default 1)")
    p.add_argument("--list", action="store_true",
                   help="list the programs found (pid, run, command) and exit")
    p.set_defaults(func=_cmd_top)


def _add_dashboard(sub: Any) -> None:
    """The ``dashboard`` command (:mod:`fiber.dashboard`, imported when it runs)."""
    p = sub.add_parser(
        "dashboard", help="live web page of a running fiber program's pools",
        description="Serve a live web page about a running fiber program of this user on "
        "this machine (found as `fiber top` finds it): per pool, its workers by state, "
        "host and placement, its queue and throughput over the last minutes, task times "
        "per function, the slowest running tasks, the last errors with their remote "
        "tracebacks, lost workers and adaptation decisions. It prints the page's URL, "
        "which holds a random token (requests without it are refused), and how to open "
        "it from another machine through `ssh -L`. The program is asked over its own "
        "authenticated connection, and only while a page is open. Ctrl-C stops it; it "
        "stops by itself when the program ends.")
    p.add_argument("--pid", type=int,
                   help="the program to show (default: the only one, else the newest)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8790,
                   help="port to listen on (default 8790, or the next free one; 0: any)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between refreshes of an open page (default 1)")
    p.set_defaults(func=_cmd_dashboard)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from fiber import dashboard

    return dashboard.command(args)


def _cmd_top(args: argparse.Namespace) -> int:
    from fiber import top

    return top.command(args)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fiber", description=DESCRIPTION, epilog=EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action=_Version,
                     help="show the versions of fiber-core and of the installed plugins")
    sub = top.add_subparsers(dest="command_name", title="commands", metavar="COMMAND",
                             help="what to do (fiber COMMAND --help says more)")
    listing = sub.add_parser(
        "backends", help="list the installed backends and their packages",
        description="List the installed backends, each with the package that provides "
        "it. A backend that cannot be used (a plugin that cannot be loaded or "
        "declared, a class path that does not resolve, a class that does not implement "
        "the contract) is listed with BROKEN: and the reason; the exit status is 0 "
        "all the same, unless --strict.")
    listing.add_argument("--strict", action="store_true",
                         help="exit with status 1 when a backend is broken")
    listing.set_defaults(func=_cmd_backends)
    sub.add_parser("config", help="show the effective settings and their sources",
                   description="Show every setting: its value, where the value comes "
                   "from (code, environment, a .fiberconfig file or the default), its "
                   "environment variable and what it means.").set_defaults(func=_cmd_config)
    run = sub.add_parser(
        "run", help="run a command as a job on the backend",
        usage="fiber run [options] -- COMMAND [ARG ...]",
        description="Run COMMAND itself as a job on the backend (the program's main "
        "process included), print its output, and exit with its exit code. Ctrl-C "
        "terminates the job. The options override the settings of the same names.")
    run.add_argument("--backend", metavar="NAME",
                     help="backend to run the job on (default: the backend setting)")
    run.add_argument("--image", help="container image of the job (container backends)")
    run.add_argument("--cpu", type=float, help="cores to request for the job")
    run.add_argument("--memory", help="memory to request for the job: MiB, or 4G, 512M")
    run.add_argument("--gpu", type=int, help="GPUs to request for the job")
    run.add_argument("--build", nargs="?", const=".", metavar="DIR",
                     help="first make the program's image from DIR (default: the current "
                     "directory) as `fiber build` does, then run the command there")
    run.add_argument("--registry", dest="image_registry", metavar="HOST:PORT[/PATH]",
                     help="with --build: registry to push the image to (default: the "
                     "image_registry setting)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                     help="the command and its arguments, after --")
    run.set_defaults(func=_cmd_run)
    build = sub.add_parser(
        "build", help="make (and push) the image of a program",
        description="Make the container image of the program in DIR (default: the "
        "current directory) for the backend: from DIR's Dockerfile if it has one, else "
        "from the image_base setting with the launching Python's version, fiber-core, "
        "the backend's plugin and the distributions the program imports, installed from "
        "this environment, and DIR's files as the working directory. The tag is a hash of "
        "what goes in; a tag that exists is not built again. The image is pushed to the "
        "image_registry setting, and its reference printed. `fiber run --build` does this "
        "and runs the program there.")
    build.add_argument("directory", nargs="?", default=".", metavar="DIR",
                       help="the program's code directory (default: the current one)")
    build.add_argument("--backend", metavar="NAME",
                       help="backend the image is for (default: the backend setting)")
    build.add_argument("--registry", dest="image_registry", metavar="HOST:PORT[/PATH]",
                       help="registry to push to (default: the image_registry setting)")
    build.set_defaults(func=_cmd_build)
    for name, func, text, more in (
            ("jobs", _cmd_jobs, "list fiber's jobs on the backend",
             "List fiber's jobs on the backend, whichever process created them: id, "
             "state, run id and name; then how many of them belong to programs that "
             "have ended (orphans), and what ended programs left on this machine "
             "(shared-memory segments, semaphores, log directories)."),
            ("clean", _cmd_clean, "end orphaned jobs and remove what ended programs left",
             "Without options: kill and remove the jobs whose program has ended (its "
             "main process is gone: killed, or its jobs outlived it), leave the jobs of "
             "running programs alone and say which, and remove the shared-memory "
             "segments, semaphores and log directories that ended programs left on "
             "this machine. A run whose main process is not known on this machine "
             "counts as running. --run ID ends one run's jobs, running or not; --all "
             "every fiber job of the user on the backend, after a question (--yes "
             "skips it). A program whose jobs are killed sees them die (a Pool "
             "replaces its workers).")):
        p = sub.add_parser(name, help=text, description=more)
        p.add_argument("--backend", metavar="NAME",
                       help="backend to look at (default: the backend setting)")
        which = p.add_mutually_exclusive_group() if name == "clean" else p
        which.add_argument("--run", metavar="ID",
                           help="only the jobs of this run (the run= column of fiber jobs)")
        if name == "clean":
            which.add_argument("--all", action="store_true",
                               help="end every fiber job on the backend, those of "
                               "running programs too (asks first)")
            p.add_argument("--yes", action="store_true",
                           help="with --all: do not ask (for scripts)")
        p.set_defaults(func=func)
    _add_top(sub)
    _add_dashboard(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    if args.command_name is None:
        top.print_help()
        return 0
    try:
        result: int = args.func(args)
        return result
    except Exception as exc:  # noqa: BLE001 - a CLI reports errors as messages
        if isinstance(exc, (BackendError, BackendNotFoundError, ConfigError)):
            print(f"fiber: {exc}", file=sys.stderr)
            return 1
        raise
    finally:
        # close the backend this command used (the local one removes its log directory)
        registry.reset_instances()


if __name__ == "__main__":
    sys.exit(main())
