"""The local backend's template process (fiber.backend.local.forkserver): what it does once for all
jobs must not change what a job sees, compared with a new interpreter (spawn).

The end-to-end tests run scripts in a fresh interpreter on the real local backend,
with jobs forked from the template and, for comparison, spawned.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import statistics
import types

import pytest

from fiber.backend.local import forkserver, preload

METHODS = ["forkserver", "spawn"]


def _module(name: str, path: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.util.spec_from_file_location(name, path)
    return mod


def test_preload_plan(tmp_path):
    """Unit test of the plan alone: module objects made here stand in for
    sys.modules."""
    fresh = tmp_path / "fresh.py"
    fresh.write_text("X = 1\n")
    stale = tmp_path / "stale.py"
    stale.write_text("X = 2\n")
    nocache = tmp_path / "nocache.py"
    nocache.write_text("X = 3\n")
    py_compile.compile(str(fresh))
    py_compile.compile(str(stale))
    os.utime(importlib.util.cache_from_source(str(stale)), (1, 1))  # older than source
    modules = {
        "fresh": _module("fresh", str(fresh)),
        "stale": _module("stale", str(stale)),
        "nocache": _module("nocache", str(nocache)),
        "statistics": statistics,
        "this": _module("this", os.path.join(os.path.dirname(os.__file__), "this.py")),
        "__main__": _module("__main__", str(nocache)),
        "builtin_sys": types.ModuleType("builtin_sys"),
    }
    names, sources = preload.preload_plan(modules)
    assert names == [("statistics", statistics.__file__)]
    assert sorted(sources) == sorted([("stale", str(stale)), ("nocache", str(nocache))])


def test_cached_code_is_used_only_for_the_same_source(tmp_path):
    """Unit test of the code cache: an unchanged source reuses the compiled code, a
    changed one is compiled again (a fake loader method records the calls)."""
    calls = []

    def original(self, data, path, *, _optimize=-1):
        calls.append(path)
        return compile(data, path, "exec", dont_inherit=True)

    source = b"VALUE = 1\n"
    code = compile(source, "m.py", "exec", dont_inherit=True)
    # private: a unit test of the forkserver's compile cache, filled and read directly
    preload._compiled["m.py"] = (source, code)
    try:
        cached = preload._cached_source_to_code(original)
        assert cached(None, source, "m.py") is code
        assert calls == []
        changed = cached(None, b"VALUE = 2\n", "m.py")
        assert calls == ["m.py"]
        namespace: dict = {}
        exec(changed, namespace)
        assert namespace["VALUE"] == 2
    finally:
        preload._compiled.pop("m.py", None)


SCRIPT = """
    import os
    import sys
    import statistics  # a standard library module the template imports for the jobs

    import fiber
    import helper  # no bytecode cache (PYTHONDONTWRITEBYTECODE): the template compiles it

    def report(q):
        import helper as h
        q.put((h.VALUE, h.RUNS_IN, os.getpid(), statistics.mean([1, 3]),
               sys.modules["__mp_main__"].MAIN_RUNS_IN))

    MAIN_RUNS_IN = os.getpid()

    if __name__ == "__main__":
        q = fiber.Queue()
        p = fiber.Process(target=report, args=(q,))
        p.start()  # the template exists from here on
        print("first", q.get(timeout=60)[0])
        p.join()
        with open(helper.__file__, "w") as f:  # changed after the template compiled it
            f.write("import os\\nVALUE = 'changed'\\nRUNS_IN = os.getpid()\\n")
        p = fiber.Process(target=report, args=(q,))
        p.start()
        value, runs_in, pid, mean, main_runs_in = q.get(timeout=60)
        p.join()
        print("second", value, runs_in == pid, main_runs_in == pid, mean)
"""


@pytest.mark.parametrize("method", METHODS)
def test_jobs_run_their_modules_themselves(run_script, tmp_path, method):
    """The parent's main module and its non-standard imports run in the job itself
    (as with spawn), and a source changed after the template started is the one a
    job runs."""
    (tmp_path / "helper.py").write_text(
        "import os\nVALUE = 'original'\nRUNS_IN = os.getpid()\n")
    result = run_script(SCRIPT, env={"FIBER_BACKEND": "local",
                                     "FIBER_LOCAL_START_METHOD": method,
                                     "PYTHONDONTWRITEBYTECODE": "1"}, timeout=90)
    assert result.returncode == 0, result.stderr
    assert "first original" in result.stdout
    assert "second changed True True 2" in result.stdout


@pytest.mark.parametrize("method", METHODS)
def test_template_imports_stdlib_quietly_and_skips_denied(run_script, method):
    """Modules with import side effects (``this`` prints the Zen of Python) are left
    to the jobs, which run the main module's imports themselves: the output is the
    same as with spawned jobs (once from the parent, once from the job). A deprecated
    module the parent imported is not imported again, with its warning, by the
    template."""
    code = """
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import this  # noqa: F401 - prints on import
            import imp  # noqa: F401 - deprecated: warns on import

        import fiber

        def job():
            print("job ran")

        if __name__ == "__main__":
            p = fiber.Process(target=job)
            p.start()
            p.join()
            print("exitcode", p.exitcode)
    """
    result = run_script(code, env={"FIBER_BACKEND": "local",
                                   "FIBER_LOCAL_START_METHOD": method,
                                   "PYTHONWARNINGS": "always"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("The Zen of Python") == 2
    assert "job ran" in result.stdout
    assert "exitcode 0" in result.stdout
    assert "DeprecationWarning" not in result.stderr, result.stderr


LOG_SCRIPT = """
    import sys
    import fiber
    from fiber.runtime import run

    def child():
        print("child ran", file=sys.stderr)

    if __name__ == "__main__":
        for _ in range(2):  # the second job is forked from a template that ran one
            p = fiber.Process(target=child)
            p.start()
            p.join()
            print(repr(run.backend().logs(p.job)))  # its backend: the default
"""


@pytest.mark.parametrize("method", METHODS)
def test_job_logs_carry_no_runpy_warning(run_script, method):
    """A job's own log (the local backend's file its stdout and stderr go to before
    the bootstrap forwards them) has no ``RuntimeWarning: 'fiber.runtime.bootstrap'
    found in sys.modules``: the template imported the bootstrap for its imports, and
    the forked child ran it with runpy while it was still in sys.modules."""
    result = run_script(LOG_SCRIPT, env={"FIBER_BACKEND": "local",
                                         "FIBER_LOCAL_START_METHOD": method}, timeout=90)
    assert result.returncode == 0, result.stderr
    logs = result.stdout.splitlines()
    assert len(logs) == 2, result.stdout
    assert "child ran" in result.stderr
    for log in logs:
        assert "Warning" not in log and "found in sys.modules" not in log, log



def test_a_template_whose_backend_is_gone_ends_quietly(tmp_path):
    """The template (a real ``python -m fiber.backend.local.forkserver``) spawns a job
    that then exits; the backend's end of their socket no longer reads (``SHUT_RD``: its
    process died between the job's start and its end, and the template has not seen
    the end of the stream yet), so telling it of the job's end fails with EPIPE. The
    template ends quietly, as when it reads the end of the stream; before, it died
    with a BrokenPipeError traceback in the program's terminal (seen once when a
    program with a running pool was killed)."""
    import socket
    import subprocess
    import sys

    # The job exits only once the test has shut its reading down (a file it waits for,
    # at most 60 s): a job that exited at once (the standard library's `this`) could
    # end, and the template tell it, before the shutdown on a loaded machine, and the
    # template then waited for more (issue #44).
    gate = tmp_path / "shut"
    (tmp_path / "gated_job.py").write_text(
        "import os, time\n"
        "deadline = time.monotonic() + 60\n"
        "while not os.path.exists(os.environ['GATE']) and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        template = subprocess.Popen(
            [sys.executable, "-m", forkserver.__name__, str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(theirs.fileno(),),
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)})
        theirs.close()
        try:
            forkserver.send_message(ours, ("spawn", 1, "gated_job",
                                           {**os.environ, "GATE": str(gate)}, "",
                                           str(tmp_path / "job.log")))
            buffer = bytearray()
            got: list = []
            ours.settimeout(30)
            while not got:
                got = forkserver.recv_message(ours, buffer)
            assert got == [("spawned", 1, got[0][2])], got
            ours.shutdown(socket.SHUT_RD)
            gate.touch()
            _, err = template.communicate(timeout=30)
        finally:
            if template.poll() is None:
                template.kill()
                template.wait()
    assert template.returncode == 0 and b"Traceback" not in err, err.decode()


BIG_JOB = """
import json, os, resource, sys
_r = resource.getrusage(resource.RUSAGE_SELF)
with open(os.environ["JOB_OUT"], "w") as _f:  # (fails in the template's import)
    json.dump({"cpu": _r.ru_utime + _r.ru_stime, "name": __name__, "file": __file__,
               "argv0": sys.argv[0], "spec": __spec__.name, "package": __package__,
               "imported": "bigjob" in sys.modules, "loader": __loader__ is __spec__.loader,
               "secret": os.environ.get("JOB_SECRET"),
               "template_only": os.environ.get("TEMPLATE_ONLY")}, _f)
sys.exit(int(os.environ["JOB_EXIT"]))
"""


def test_a_forked_job_runs_its_module_from_the_template_s_compiled_code(tmp_path, monkeypatch):
    """A real template forks two jobs of a module with no bytecode cache
    (``PYTHONDONTWRITEBYTECODE``) whose source takes a quarter of a second of CPU to
    compile: each job runs it as ``python -m`` would (``__main__``, its file, spec and
    package, not in sys.modules under its name, its own environment and exit code)
    without compiling it again: a job spends well under the compile's CPU before its
    first line. Before, every job searched for its module and compiled it (without a
    ``.pyc``, the bootstrap's compile was a third of a pool worker's CPU before its
    first task)."""
    from fiber.backend.local.template import ForkServer

    source = BIG_JOB + "\n".join(
        f"def f{i}(a, b=({i}, '{i}')):\n    return [a + b[0] * {i} for _ in range({i} % 3)]"
        for i in range(2000))
    (tmp_path / "bigjob.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("TEMPLATE_ONLY", "1")  # the template's, not the jobs'
    started = time_compile = __import__("time").process_time()
    compile(source, "bigjob.py", "exec")
    time_compile = __import__("time").process_time() - started
    server = ForkServer(["bigjob"])
    try:
        reports = []
        for i in range(2):
            out = tmp_path / f"out{i}.json"
            env = {**os.environ, "JOB_OUT": str(out), "JOB_SECRET": f"s{i}",
                   "JOB_EXIT": str(3 + i)}
            del env["TEMPLATE_ONLY"]
            child = server.spawn("bigjob", env, str(tmp_path), str(tmp_path / f"job{i}.log"), 30)
            assert child.wait(60) == 3 + i, (tmp_path / f"job{i}.log").read_text()
            reports.append(__import__("json").loads(out.read_text()))
    finally:
        server.close()
    for i, report in enumerate(reports):
        assert report["name"] == "__main__" and report["spec"] == "bigjob"
        assert report["file"] == report["argv0"] == str(tmp_path / "bigjob.py")
        assert report["package"] == "" and report["loader"] and not report["imported"]
        assert report["secret"] == f"s{i}" and report["template_only"] is None
        # compiling it again would cost about time_compile
        assert report["cpu"] < time_compile / 3, (report["cpu"], time_compile)
    assert not list(tmp_path.glob("__pycache__"))


BIG_MAIN = """
import os, resource, sys
import fiber

def report(q):
    r = resource.getrusage(resource.RUSAGE_SELF)
    q.put((r.ru_utime + r.ru_stime, sys.modules["__mp_main__"].__file__,
           MAIN_RUNS_IN == os.getpid()))

MAIN_RUNS_IN = os.getpid()

if __name__ == "__main__":
    import time
    with open(__file__) as f:
        source = f.read()
    t = time.process_time()
    compile(source, __file__, "exec")
    compile_cpu = time.process_time() - t
    q = fiber.Queue()
    for _ in range(2):
        p = fiber.Process(target=report, args=(q,))
        p.start()
        cpu, path, ran_here = q.get(timeout=60)
        p.join()
        print("job", path == os.path.abspath(__file__), ran_here, p.exitcode,
              "fast" if cpu < compile_cpu / 3 else f"slow {cpu:.3f} of {compile_cpu:.3f}")
"""


def test_a_job_imports_its_parent_s_main_script_from_the_template_s_code(run_script):
    """The parent's main script (which Python never caches as bytecode) takes a
    quarter of a second of CPU to compile; its jobs, forked from the template, import
    it as ``__mp_main__`` themselves (its top level runs in the job) without compiling
    it: a job's CPU when its target runs is well under the compile's. Before, every
    job compiled its parent's script again (runpy.run_path)."""
    code = BIG_MAIN + "\n".join(
        f"def f{i}(a, b=({i}, '{i}')):\n    return [a + b[0] * {i} for _ in range({i} % 3)]"
        for i in range(2000))
    result = run_script(code, env={"FIBER_BACKEND": "local"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("job True True 0 fast") == 2, result.stdout
