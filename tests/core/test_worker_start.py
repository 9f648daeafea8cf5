"""What a job forked by the local backend's template does less of as it starts (issue
#29: a worker's CPU from its fork to its first task is mostly copy-on-write page
faults on the template's memory, so every step a job no longer takes is a saving).
Real template processes and real jobs; what a job finds is reported by the job."""

from __future__ import annotations

import json
import os

from fiber.backend.local.template import ForkServer

# a job module that has its settings prepared by the template as fiber's bootstrap
# does (its FORKED_PREPARE); it reports what it finds
SETTINGS_JOB = """
import json, os, sys
from fiber.runtime import config
FORKED_PREPARE = config.prepare_for_child
if __name__ == "__main__":
    cfg = config._current  # (private read: what the template prepared, before any get_config)
    with open(os.environ["JOB_OUT"], "w") as f:
        json.dump(None if cfg is None else {
            "log_level": cfg.log_level, "heartbeat_timeout": cfg.heartbeat_timeout,
            "same": cfg.values == config.load({}).values}, f)
"""


def _spawn(server: ForkServer, tmp_path, cwd, name: str, **env: str) -> object:
    out = tmp_path / f"{name}.json"
    job_env = {**os.environ, **env, "JOB_OUT": str(out)}
    child = server.spawn("settingsjob", job_env, str(cwd), str(tmp_path / f"{name}.log"), 30)
    assert child.wait(60) == 0, (tmp_path / f"{name}.log").read_text()
    return json.loads(out.read_text())


def test_a_forked_job_finds_its_own_settings_computed(tmp_path, monkeypatch):
    """The template computes each job's settings before it forks it (the job module's
    ``FORKED_PREPARE``, as fiber's bootstrap has it), from the job's
    environment and working directory (not the template's), again when a settings file
    changed, and not at all when they are bad (the job reads them itself and reports
    the error): a job finds what it would have read itself. Before, every job read
    its settings (files, variables, parsers) as it started."""
    (tmp_path / "settingsjob.py").write_text(SETTINGS_JOB)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("FIBER_LOG_LEVEL", raising=False)
    server = ForkServer(["settingsjob"])
    try:
        (work / ".fiberconfig").write_text("[default]\nheartbeat_timeout = 41\n")
        first = _spawn(server, tmp_path, work, "first", FIBER_LOG_LEVEL="DEBUG")
        (work / ".fiberconfig").write_text("[default]\nheartbeat_timeout = 42.5\n")
        second = _spawn(server, tmp_path, work, "second")
        in_tmp = _spawn(server, tmp_path, tmp_path, "tmp")  # no settings file there
        bad = _spawn(server, tmp_path, work, "bad", FIBER_HEARTBEAT_TIMEOUT="soon")
    finally:
        server.close()
    assert first == {"log_level": "DEBUG", "heartbeat_timeout": 41.0, "same": True}
    assert second == {"log_level": "WARNING", "heartbeat_timeout": 42.5, "same": True}
    assert in_tmp == {"log_level": "WARNING", "heartbeat_timeout": 30.0, "same": True}
    assert bad is None


THREADS_SCRIPT = """
import sys, threading
import fiber

def threads_now(say):
    if say:
        print("out line")
        print("err line", file=sys.stderr)
        sys.stdout.flush()
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("fiber-output"))

def bootstrap_is_the_template_s():
    boot = sys.modules.get("fiber.runtime.bootstrap")
    return boot is not None and type(sys.stdout) is boot._Forwarder

def streams_are_the_template_s():
    # (private read: the stream the job's stdout falls back to, its log)
    original = sys.stdout._original
    return original is sys.__stdout__ and original.fileno() == 1

if __name__ == "__main__":
    with fiber.Pool(1) as pool:
        print("quiet", pool.apply(threads_now, (False,)))
        print("said", pool.apply(threads_now, (True,)))
        print("same module", pool.apply(bootstrap_is_the_template_s))
        print("same streams", pool.apply(streams_are_the_template_s))
"""


def test_a_worker_starts_one_output_thread_when_it_first_prints(run_script):
    """A pool worker that has printed nothing has no thread waiting to send its output;
    its first line starts one, for both streams, and its lines reach the parent's
    stdout and stderr. Before, every job started two (one per stream) as it began."""
    result = run_script(THREADS_SCRIPT, env={"FIBER_BACKEND": "local"})
    assert result.returncode == 0, result.stderr
    assert "quiet []" in result.stdout, result.stdout
    assert "said ['fiber-output']" in result.stdout, result.stdout
    assert "out line" in result.stdout and "err line" in result.stderr


def test_a_forked_job_runs_the_template_s_bootstrap(run_script):
    """A job forked by the template calls the bootstrap the template imported (its
    ``FORKED_MAIN``) rather than executing the module's code again as ``__main__``
    (which made its classes and functions anew: about a hundred pages of the
    template's memory copied per job)."""
    result = run_script(THREADS_SCRIPT, env={"FIBER_BACKEND": "local",
                                             "FIBER_LOCAL_START_METHOD": "forkserver"})
    assert result.returncode == 0, result.stderr
    assert "same module True" in result.stdout, result.stdout


def test_a_forked_job_writes_its_log_through_the_template_s_streams(run_script):
    """A job forked by the template, whose descriptors 1 and 2 are its log, keeps the
    template's ``sys.stdout`` and ``sys.stderr`` on them (what the bootstrap falls back
    to) rather than making two new ones (some eighty pages of the template's memory
    copied per job); a job that fails before it runs its process still has its
    traceback in the error its parent raises (tests/core/test_bootstrap_guard.py)."""
    result = run_script(THREADS_SCRIPT, env={"FIBER_BACKEND": "local",
                                             "FIBER_LOCAL_START_METHOD": "forkserver"})
    assert result.returncode == 0, result.stderr
    assert "same streams True" in result.stdout, result.stdout


def test_a_spawned_job_runs_the_bootstrap_as_main(run_script):
    """Without the template, ``python -m fiber.runtime.bootstrap`` runs it as before."""
    result = run_script(THREADS_SCRIPT, env={"FIBER_BACKEND": "local",
                                             "FIBER_LOCAL_START_METHOD": "spawn"})
    assert result.returncode == 0, result.stderr
    assert "same module False" in result.stdout and "quiet []" in result.stdout, \
        result.stdout + result.stderr


GROUP_SCRIPT = """
import os, sys
import fiber

def log_growth(_):
    before = os.fstat(1).st_size  # (descriptor 1 is the job's log)
    print("from a worker of a group")
    sys.stdout.flush()
    return os.fstat(1).st_size - before

if __name__ == "__main__":
    with fiber.Pool(2, workers_per_job=2) as pool:
        print("grew", min(pool.map(log_growth, range(8), chunksize=1)))
"""


def test_a_worker_forked_in_a_job_writes_its_output_to_the_job_s_log(run_script):
    """A worker of a job running several (``workers_per_job``: each is forked from the
    job, which owns the connection to the parent) writes what it prints to the job's
    own log. Before, its lines were queued for the job's output thread, which a
    forked process does not have: lost without a word."""
    result = run_script(GROUP_SCRIPT, env={"FIBER_BACKEND": "local"})
    assert result.returncode == 0, result.stderr
    assert "grew 25" in result.stdout, result.stdout + result.stderr


def test_a_hello_encoded_once_says_what_hello_says():
    """The template encodes its jobs' hello once but for the pid
    (``protocol.hello_maker``): the parent reads the same fields from it."""
    from fiber.wire import protocol

    made = protocol.hello_maker("host-1")(4242)
    assert protocol.parse_hello(made) == protocol.parse_hello(protocol.hello(4242, "host-1"))
    assert protocol.mismatch(protocol.parse_hello(made)) is None


# a job module that lists its open descriptors as it starts (before it opens anything)
FDS_JOB = """
import json, os
if __name__ == "__main__":
    listed = [int(fd) for fd in os.listdir("/proc/self/fd")]
    found = {}
    for fd in listed:
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # listdir's own descriptor, closed by now
    with open(os.environ["JOB_OUT"], "w") as f:
        json.dump(found, f)
"""


def test_a_forked_job_holds_none_of_the_template_s_descriptors(tmp_path, monkeypatch):
    """A job forked by the template starts with descriptors 0 (``/dev/null``), 1 and 2
    (its log) only: the template's connection to its backend, its selector and its
    signal pipe are closed in the child (by number, not through their Python objects,
    whose close methods copied some of the template's pages). A guard of the closing:
    it held before that change too."""
    (tmp_path / "fdsjob.py").write_text(FDS_JOB)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = ForkServer(["fdsjob"])
    try:
        out = tmp_path / "fds.json"
        log = tmp_path / "fds.log"
        child = server.spawn("fdsjob", {**os.environ, "JOB_OUT": str(out)}, str(tmp_path),
                             str(log), 30)
        assert child.wait(60) == 0, log.read_text()
    finally:
        server.close()
    found = {int(fd): target for fd, target in json.loads(out.read_text()).items()}
    assert found == {0: os.devnull, 1: str(log), 2: str(log)}, found


GIVE_SCRIPT = """
import threading
import fiber

def give_threads(_):
    return [t.name for t in threading.enumerate() if t.name.startswith("fiber-pool-give")]

if __name__ == "__main__":
    with fiber.Pool(1) as pool:
        print("give threads", sorted(set(sum(pool.map(give_threads, range(6), chunksize=1), []))))
"""


def test_a_worker_never_asked_to_give_back_starts_no_give_thread(run_script):
    """A pool worker's give line is opened by its first batch, but its thread starts
    only with the first recall (the job's heartbeat thread reads the line's replies
    meanwhile): a worker that is never asked to give tasks back (a pool of one here)
    runs without it. Before, every worker started it with its first batch. Recalls
    over real workers: tests/core/test_pool_late_workers.py."""
    result = run_script(GIVE_SCRIPT, env={"FIBER_BACKEND": "local"})
    assert result.returncode == 0, result.stderr
    assert "give threads []" in result.stdout, result.stdout + result.stderr
