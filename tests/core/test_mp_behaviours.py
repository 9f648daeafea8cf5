"""The less travelled behaviours of multiprocessing, each checked by running one
program twice, under ``multiprocessing`` (spawn) and under fiber (the local backend),
and comparing what the two print. Every run is bounded: a hang fails on its timeout."""

from __future__ import annotations

import subprocess

import left_logs
import pytest

RUN_TIMEOUT = 90


def _program(body: str, module: str) -> str:
    # one line each: the programs' line numbers agree
    head = ("import multiprocessing; mp = multiprocessing.get_context('spawn')\n"
            if module == "multiprocessing" else "import fiber as mp\n")
    return head + body


def _both(run_script, body: str, timeout: float = RUN_TIMEOUT,
          env: dict[str, str] | None = None) -> tuple[str, str]:
    """What ``body`` prints under multiprocessing, then under fiber; each run must end
    within ``timeout`` seconds with status 0."""
    import textwrap

    body = textwrap.dedent(body)
    outputs = []
    for module in ("multiprocessing", "fiber"):
        try:
            result = run_script(_program(body, module), timeout=timeout,
                                name=f"prog_{module}.py", env=env)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the program did not end within {timeout} s under {module}")
        assert result.returncode == 0, (module, result.stdout, result.stderr)
        outputs.append(result.stdout)
    return outputs[0], outputs[1]


NESTED = """
def node(q, level, name):
    q.put((level, name))
    print("started", name, flush=True)
    if level < 2:
        kids = [mp.Process(target=node, args=(q, level + 1, f"{name}.{i}"))
                for i in range(2)]
        for kid in kids:
            kid.start()
        if level == 0:  # the other level leaves its children to the exit's join
            for kid in kids:
                kid.join()

if __name__ == "__main__":
    q = mp.Queue()
    p = mp.Process(target=node, args=(q, 0, "p"))
    p.start()
    reports = [q.get(timeout=30) for _ in range(7)]
    p.join(30)
    print(sorted(reports), p.exitcode)
"""


def test_processes_started_by_processes_report_from_every_level(run_script):
    mp_out, fiber_out = _both(run_script, NESTED)

    def report(out: str) -> str:
        (line,) = [line for line in out.splitlines() if line.startswith("[(")]
        return line

    # the reports through the queue, from every level, as multiprocessing's
    assert report(fiber_out) == report(mp_out)
    assert "(2, 'p.1.1')" in fiber_out
    # and each process's print, a whole line each (multiprocessing's children share
    # one descriptor: their lines can run into each other there, so its prints are not
    # compared line for line; fiber's parent writes its children's lines whole)
    names = [name for _, name in __import__("ast").literal_eval(report(fiber_out)[:-2])]
    started = sorted(line for line in fiber_out.splitlines() if line != report(fiber_out))
    assert started == sorted(f"started {name}" for name in names), fiber_out


THREAD_AT_EXIT = """
import threading, time

def late(q, ev):
    time.sleep(1)
    print("the thread prints", flush=True)
    ev.set()

def target(q, ev):
    threading.Thread(target=late, args=(q, ev)).start()
    print("the target returns", flush=True)

if __name__ == "__main__":
    q = mp.Queue()
    ev = mp.Event()
    p = mp.Process(target=target, args=(q, ev))
    p.start()
    p.join(30)
    print("exit code", p.exitcode, "event set", ev.is_set())
"""
# (the thread does not report through the queue: multiprocessing's child joins its
# queues' feeders before it waits for its threads, so an item a late thread puts may be
# lost there, and the comparison would be of that race)


def test_a_child_waits_for_its_threads_before_it_exits(run_script):
    mp_out, fiber_out = _both(run_script, THREAD_AT_EXIT)
    assert fiber_out == mp_out
    assert "event set True" in fiber_out


PARENT_SENTINEL = """
import time
from multiprocessing.connection import wait

def grandchild(q):
    parent = mp.parent_process()
    # taken before the parent can be killed: a fiber job that has not taken it exits
    # at once when its parent is gone (docs/architecture.md, "Differences")
    sentinel = parent.sentinel
    q.put(("parent alive", parent.is_alive()))
    ready = wait([sentinel], timeout=30)
    q.put(("parent gone", bool(ready), parent.is_alive()))

def child(q):
    mp.Process(target=grandchild, args=(q,)).start()
    time.sleep(60)

if __name__ == "__main__":
    q = mp.Queue()
    c = mp.Process(target=child, args=(q,))
    c.start()
    print(q.get(timeout=30))
    c.kill()
    c.join(30)
    print(q.get(timeout=30))
"""


def test_parent_process_sentinel_follows_the_real_parent(run_script, tmp_path):
    """The child is killed (SIGKILL): the log directory its backend made for the
    grandchild stays (in a temp directory of the program's own) and is removed here."""
    tmpdir = left_logs.own_tmpdir(tmp_path)
    mp_out, fiber_out = _both(run_script, PARENT_SENTINEL, env={"TMPDIR": tmpdir})
    assert fiber_out == mp_out
    assert "('parent gone', True, False)" in fiber_out
    left_logs.remove_left_logs(tmpdir)


def test_a_child_watching_its_parent_still_exits_after_the_grace(run_script, tmp_path):
    """fiber only: a job outlives its parent by at most parent_link.GRACE seconds, even
    when it watches the parent's sentinel and never ends by itself (no orphans). The
    killed child's log directory is removed here (tests/left_logs.py)."""
    tmpdir = left_logs.own_tmpdir(tmp_path)
    result = run_script("""
        import os, time
        import fiber
        from fiber.runtime import parent_link

        def grandchild(q):
            fiber.parent_process().sentinel
            q.put(os.getpid())
            time.sleep(120)

        def child(q):
            fiber.Process(target=grandchild, args=(q,)).start()
            time.sleep(120)

        if __name__ == "__main__":
            q = fiber.Queue()
            c = fiber.Process(target=child, args=(q,))
            c.start()
            pid = q.get(timeout=30)
            c.kill()
            c.join(30)
            start = time.monotonic()
            while time.monotonic() - start < parent_link.GRACE + 20:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            waited = time.monotonic() - start
            print("gone after", round(waited), "s; limit", parent_link.GRACE + 20)
            print("ended", waited < parent_link.GRACE + 20)
        """, timeout=90, env={"TMPDIR": tmpdir})
    assert result.returncode == 0, result.stderr
    assert "ended True" in result.stdout, result.stdout
    left_logs.remove_left_logs(tmpdir)


UNCLOSED_POOL = """
import gc, warnings

if __name__ == "__main__":
    warnings.simplefilter("always", ResourceWarning)
    with warnings.catch_warnings(record=True) as caught:
        pool = mp.Pool(2)
        print(pool.apply(abs, (-3,)))
        del pool
        gc.collect()
    print([w.category.__name__ for w in caught])
    print([str(w.message).split(" pool ")[0] for w in caught])
    with warnings.catch_warnings(record=True) as caught:
        with mp.Pool(2) as pool:
            print(pool.apply(abs, (-4,)))
        del pool
        closed = mp.Pool(2)
        closed.close()
        closed.join()
        del closed
        gc.collect()
    print("warnings of pools ended properly:", len(caught))
    with warnings.catch_warnings(record=True) as caught:
        # a filter written for multiprocessing's text
        warnings.filterwarnings("ignore", message="unclosed running multiprocessing pool",
                                category=ResourceWarning)
        pool = mp.Pool(2)
        print(pool.apply(abs, (-5,)))
        del pool
        gc.collect()
    print("warnings past the filter:", len(caught))
"""


def test_an_unclosed_running_pool_warns_when_collected(run_script):
    mp_out, fiber_out = _both(run_script, UNCLOSED_POOL)
    # fiber's text is multiprocessing's ("unclosed running multiprocessing pool <...>",
    # the pool's repr its own), so that a filter written for multiprocessing's warning
    # matches fiber's (before: "unclosed running fiber pool", which it did not)
    expected = ("3\n['ResourceWarning']\n['unclosed running multiprocessing']\n4\n"
                "warnings of pools ended properly: 0\n5\nwarnings past the filter: 0\n")
    assert fiber_out == expected
    # multiprocessing's own pool is not collected at a fixed moment (its handler threads
    # can still hold it: here its warning came at once, later, or not at all), so its
    # output is no oracle for when; when it warns, it is this warning
    assert mp_out.splitlines()[0] == "3" and "4" in mp_out.splitlines(), mp_out
    assert "warnings past the filter: 0" in mp_out, mp_out
    if "ResourceWarning" in mp_out:
        assert "['unclosed running multiprocessing']" in mp_out, mp_out


REMOTE_TRACEBACK = """
import functools

def boom(x, y):
    z = x + y
    raise ValueError(f"bad {z}")

class Task:
    def __call__(self, x):
        raise KeyError(x)

if __name__ == "__main__":
    with mp.Pool(1) as pool:
        # a partial of a function of __main__, an instance of a class of __main__:
        # fiber sends both by value (cloudpickle)
        for func, arg in ((functools.partial(boom, 1), 2), (Task(), 5)):
            try:
                pool.apply(func, (arg,))
            except Exception as exc:
                text = str(exc.__cause__)
                # the frames after the pool's own (its worker's code differs)
                print(text[text.index('  File "', text.index("line") + 1):])
"""


def test_remote_tracebacks_show_the_source_of_tasks_sent_by_value(run_script):
    mp_out, fiber_out = _both(run_script, REMOTE_TRACEBACK)
    assert fiber_out == mp_out.replace("prog_multiprocessing.py", "prog_fiber.py")
    assert 'raise ValueError(f"bad {z}")' in fiber_out and "raise KeyError(x)" in fiber_out


def test_the_parent_fills_in_source_lines_the_worker_cannot_read(run_script):
    """fiber only: the worker cannot read the script (deleted after the parent read
    it, as a script missing from a cluster's image); the traceback still shows the
    line, from the parent's copy."""
    result = run_script("""
        import linecache, os
        import fiber

        def boom(x):
            raise ValueError(x)

        if __name__ == "__main__":
            linecache.getlines(__file__)  # the parent has read its source ...
            os.remove(__file__)  # ... which the workers cannot find
            with fiber.Pool(1) as pool:
                try:
                    pool.apply(boom, (1,))
                except ValueError as exc:
                    print(exc.__cause__)
        """)
    assert result.returncode == 0, result.stderr
    assert "main.py\", line 6, in boom\n    raise ValueError(x)\n" in result.stdout, \
        result.stdout


LISTENER = """
import importlib, time
conn = importlib.import_module("fiber.connection" if getattr(mp, "__name__", "") == "fiber"
                               else "multiprocessing.connection")

def child(address, family):
    with conn.Client(address, family) as c:
        got = c.poll(20)  # polls while its parent waits in accept(), then sleeps
        print("child polled", got, c.recv() if got else None, flush=True)
        c.send("thanks")

if __name__ == "__main__":
    for family, address in (("AF_UNIX", "\\0fiber-test-%d" % time.time_ns()),
                            ("AF_INET", None)):
        with conn.Listener(address, family) as listener:
            p = mp.Process(target=child, args=(listener.address, family))
            p.start()
            with listener.accept() as c:
                time.sleep(0.5)
                c.send("hello")
                print(family, "parent got", c.recv(), flush=True)
            p.join(30)
        print(family, "child exit code", p.exitcode, flush=True)
"""


def test_listener_as_context_manager_on_an_abstract_address_and_a_polling_client(run_script):
    """A Listener used as a context manager, on an abstract Unix address and on TCP,
    its owner waiting in accept() while a child's Client polls: as multiprocessing
    (the lines of the two processes in any order; buffered, as Python runs by default,
    so that multiprocessing's processes write whole lines too)."""
    mp_out, fiber_out = _both(run_script, LISTENER, env={"PYTHONUNBUFFERED": ""})
    assert sorted(fiber_out.splitlines()) == sorted(mp_out.splitlines())
    assert fiber_out.count("child polled True hello") == 2
