"""A job that fails while it prepares itself (importing its parent's ``__main__``
module) must end, and its parent must get a clear error, never hang.

Each test runs a script in a fresh interpreter with a timeout, on the real local
backend (both of its start methods), then checks that no process of that run is left:
every process the script starts (the fork-server template, the jobs) inherits a unique
token in its environment, looked up in /proc.
"""

from __future__ import annotations

import time
import uuid

import pytest
from procs import processes_with

START_METHODS = ["forkserver", "spawn"]


def _run(run_script, code: str, method: str, timeout: float = 60):
    token = uuid.uuid4().hex
    env = {"FIBER_BACKEND": "local", "FIBER_LOCAL_START_METHOD": method,
           "GUARD_TEST_TOKEN": token}
    result = run_script(code, env=env, timeout=timeout)
    deadline = time.monotonic() + 10
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(token) == [], "processes of the script are still running"
    return result


POOL_WITHOUT_GUARD = """
    import fiber

    def square(x):
        return x * x

    pool = fiber.Pool(2)
    print("result", pool.map(square, range(10)))
    pool.close()
    pool.join()
"""

PROCESS_WITHOUT_GUARD = """
    import fiber

    def hello():
        print("hello from the child")

    p = fiber.Process(target=hello)
    p.start()
    try:
        p.join()
    except fiber.ProcessStartError as exc:
        print("EXITCODE", p.exitcode)
        raise
"""

MANAGER_WITHOUT_GUARD = """
    import fiber

    def work(d):
        d["x"] = 1

    manager = fiber.Manager()
    d = manager.dict()
    p = fiber.Process(target=work, args=(d,))
    p.start()
    p.join()
    print("result", dict(d))
    manager.shutdown()
"""


@pytest.mark.parametrize("method", START_METHODS)
def test_pool_without_main_guard_fails_clearly(run_script, method):
    result = _run(run_script, POOL_WITHOUT_GUARD, method)
    assert result.returncode != 0
    assert "result" not in result.stdout
    last = result.stderr.strip().splitlines()
    # the parent's own error is a ProcessStartError carrying the job's traceback
    assert "fiber.errors.ProcessStartError" in result.stderr
    assert "failed while preparing" in result.stderr
    assert "RuntimeError: An attempt has been made to start a new process" in result.stderr
    assert "__main__" in result.stderr
    assert "if __name__ == '__main__':" in result.stderr
    assert last, result.stderr
    # the job's traceback once, however many workers failed alike (it was five times)
    assert result.stderr.count("in check_not_importing_main") == 1, result.stderr
    assert result.stderr.count("Every fiber job imports the main module") == 1


@pytest.mark.parametrize("method", START_METHODS)
def test_process_without_main_guard_fails_clearly(run_script, method):
    result = _run(run_script, PROCESS_WITHOUT_GUARD, method)
    assert result.returncode != 0
    assert "hello from the child" not in result.stdout
    assert "EXITCODE 1" in result.stdout
    assert "ProcessStartError" in result.stderr
    assert "if __name__ == '__main__':" in result.stderr
    assert "__main__" in result.stderr
    assert result.stderr.count("in check_not_importing_main") == 1, result.stderr


def test_manager_without_main_guard_fails_clearly(run_script):
    result = _run(run_script, MANAGER_WITHOUT_GUARD, "forkserver")
    assert result.returncode != 0
    assert "result" not in result.stdout
    assert "if __name__ == '__main__':" in result.stderr


EXECUTOR_WITHOUT_GUARD = """
    import concurrent.futures as cf
    import fiber

    def square(x):
        return x * x

    with cf.ProcessPoolExecutor(2, mp_context=fiber.get_context()) as executor:
        print("result", list(executor.map(square, range(10))))
"""


def test_process_pool_executor_without_main_guard_fails_clearly(run_script):
    """concurrent.futures on a fiber context: its workers fail alike, their traceback
    is printed once, and the executor is broken (BrokenProcessPool), as with
    multiprocessing's spawn (which prints it once per worker)."""
    result = _run(run_script, EXECUTOR_WITHOUT_GUARD, "forkserver")
    assert result.returncode != 0
    assert "result" not in result.stdout
    assert "BrokenProcessPool" in result.stderr
    assert "if __name__ == '__main__':" in result.stderr
    assert result.stderr.count("in check_not_importing_main") == 1, result.stderr
    assert result.stderr.count("Every fiber job imports the main module") == 1


@pytest.mark.parametrize("method", START_METHODS)
def test_child_failing_after_connecting_back_exits(run_script, method):
    """Regression: the job connected to its parent, then importing the main module
    raised; the job must exit (no orphan) and the parent raise its traceback."""
    code = """
        import fiber

        if __name__ == "__mp_main__":  # only in the job
            raise ValueError("boom while importing main")

        def hello():
            print("hello from the child")

        if __name__ == "__main__":
            p = fiber.Process(target=hello)
            p.start()
            try:
                p.join(60)
            except fiber.ProcessStartError as exc:
                print("START ERROR", p.exitcode, "boom while importing main" in str(exc))
            else:
                print("NO ERROR", p.exitcode)
    """
    result = _run(run_script, code, method)
    assert result.returncode == 0, result.stderr
    assert "START ERROR 1 True" in result.stdout, (result.stdout, result.stderr)
    # the job's traceback reaches the parent's stderr, as a spawned child's would
    assert "ValueError: boom while importing main" in result.stderr


def test_guard_still_lets_children_start_processes(run_script):
    """With the guard, a job may start processes of its own (the check is only
    active while the job imports the main module)."""
    code = """
        import fiber

        def leaf(q):
            q.put("leaf")

        def middle(q):
            p = fiber.Process(target=leaf, args=(q,))
            p.start()
            p.join()

        if __name__ == "__main__":
            q = fiber.Queue()
            p = fiber.Process(target=middle, args=(q,))
            p.start()
            print("got", q.get(timeout=60))
            p.join()
            print("exitcode", p.exitcode)
    """
    result = _run(run_script, code, "forkserver")
    assert result.returncode == 0, result.stderr
    assert "got leaf" in result.stdout
    assert "exitcode 0" in result.stdout
