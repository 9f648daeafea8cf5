"""multiprocessing's semantics where fiber mirrors them: start methods and contexts,
the exceptions raised for objects that cannot be sent, fiber.util (Finalize, the exit
path, logging), fiber.reduction; each compared with multiprocessing itself where both
can run. Scripts run in fresh interpreters (start methods are per process)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import threading

import pytest

import fiber
import fiber.reduction
import fiber.util
from fiber.errors import SerializationError


def _generator():
    yield 1


def _unpicklables():
    return [threading.Lock(), _generator()]


def _noop(*args):
    return None


# -- start methods --------------------------------------------------------------------
def test_start_methods_as_multiprocessing_documents(run_script):
    result = run_script(
        """
        import sys
        import fiber, multiprocessing

        def child(q):
            q.put(type(fiber.current_process()).__name__)  # its context's class

        if __name__ == "__main__":
            assert fiber.get_start_method(allow_none=True) is None
            assert fiber.get_start_method() == "spawn"  # fixes the default, as mp
            methods = fiber.get_all_start_methods()
            assert sorted(methods) == sorted(multiprocessing.get_all_start_methods()), methods
            assert methods[0] == "spawn"
            try:
                fiber.set_start_method("fork")
            except RuntimeError as exc:
                print("set twice:", exc)
            fiber.set_start_method("fork", force=True)
            assert fiber.get_start_method() == "fork"
            assert fiber.get_context() is fiber.get_context("fork")
            for m in methods:
                ctx = fiber.get_context(m)
                assert ctx.get_start_method() == m, (m, ctx.get_start_method())
                assert issubclass(ctx.Process, fiber.Process)
                try:
                    ctx.set_start_method(m)
                except ValueError as exc:
                    concrete = str(exc)
            assert fiber.get_context("spawn") is not fiber.get_context("fork")
            try:
                fiber.get_context("fiber")
            except ValueError as exc:
                print("unknown:", exc)
            q = fiber.Queue()
            for m in ("fork", "forkserver", "spawn"):
                ctx = fiber.get_context(m)
                p = ctx.Process(target=child, args=(q,))
                p.start(); p.join()
                print(m, "ran", p.exitcode, q.get(timeout=60))
            fiber.set_start_method(None, force=True)
            print("reset", fiber.get_start_method(allow_none=True), concrete)
        """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [
        "set twice: context has already been set",
        "unknown: cannot find context for 'fiber'",
        "fork ran 0 ForkProcess",
        "forkserver ran 0 ForkServerProcess",
        "spawn ran 0 SpawnProcess",
        "reset None cannot set start method of concrete context",
    ], (result.stdout, result.stderr)


def test_set_executable_accepts_bytes_and_paths(run_script):
    """Regression: set_executable(b"/usr/bin/python") broke every later start."""
    result = run_script(
        f"""
        import pathlib, fiber

        def child():
            print("child ran", flush=True)

        if __name__ == "__main__":
            fiber.set_executable({os.fsencode(sys.executable)!r})
            print(fiber.get_config_value("python"))
            p = fiber.Process(target=child); p.start(); p.join()
            fiber.get_context("spawn").set_executable(pathlib.Path({sys.executable!r}))
            p = fiber.Process(target=child); p.start(); p.join()
            print("exitcode", p.exitcode)
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [sys.executable, "child ran", "child ran",
                                          "exitcode 0"]


# -- unpicklable objects: TypeError, as in multiprocessing ----------------------------------
@pytest.mark.parametrize("make", [threading.Lock, _generator], ids=["lock", "generator"])
def test_unpicklable_arguments_raise_typeerror_as_multiprocessing(make):
    # multiprocessing (spawn) raises TypeError for the same objects ...
    ctx = multiprocessing.get_context("spawn")
    a, b = ctx.Pipe()
    with pytest.raises(TypeError):
        a.send(make())
    a.close(), b.close()
    # ... and so does fiber, with its own error, which is also a PicklingError
    c, d = fiber.Pipe()
    with pytest.raises(TypeError) as info:
        c.send(make())
    assert isinstance(info.value, SerializationError)
    assert isinstance(info.value, pickle.PicklingError)
    q = fiber.Queue()
    with pytest.raises(TypeError):
        q.put(make())
    with pytest.raises(TypeError):
        fiber.Process(target=_noop, args=(make(),)).start()
    c.close(), d.close()


def test_unpicklable_task_arguments_raise_typeerror_in_a_pool():
    with multiprocessing.get_context("spawn").Pool(1) as pool, \
            pytest.raises(TypeError):
        pool.apply(_noop, (threading.Lock(),))
    with fiber.Pool(1) as pool, pytest.raises(TypeError):
        pool.apply(_noop, (threading.Lock(),))


# -- fiber.util ------------------------------------------------------------------------
def test_util_finalizers_run_at_exit_in_priority_order(run_script):
    result = run_script(
        """
        import os
        import fiber, fiber.util as util

        class Resource:
            pass

        def say(what):
            print(what, util.is_exiting(), flush=True)

        if __name__ == "__main__":
            util.Finalize(None, say, args=("prio 0",), exitpriority=0)
            util.Finalize(None, say, args=("prio 10",), exitpriority=10)
            util.Finalize(None, say, args=("prio -1",), exitpriority=-1)
            cancelled = util.Finalize(None, say, args=("cancelled",), exitpriority=5)
            cancelled.cancel()
            r = Resource()
            collected = util.Finalize(r, say, args=("collected",))
            assert collected.still_active()
            del r
            assert not collected.still_active()
            called = util.Finalize(None, say, args=("called",), exitpriority=3)
            called()
            called()  # once only
            tmp = util.get_temp_dir()
            assert os.path.isdir(tmp) and util.get_temp_dir() == tmp
            print("temp", tmp, flush=True)
            say("main")
        """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    tmp = lines.pop(2).split()[1]
    assert lines == ["collected False", "called False", "main False", "prio 10 True",
                     "prio 0 True", "prio -1 True"]
    assert not os.path.exists(tmp), "get_temp_dir() was not removed at exit"


def test_util_logging_names():
    logger = fiber.util.get_logger()
    assert logger.name == "fiber"
    import logging

    assert logging.getLevelName(fiber.util.SUBDEBUG) == "SUBDEBUG"
    assert logging.getLevelName(fiber.util.SUBWARNING) == "SUBWARNING"
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(fiber.util.SUBDEBUG)
    try:
        fiber.util.sub_warning("w %d", 1)
        fiber.util.sub_debug("d %d", 2)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (fiber.util.SUBWARNING, "w 1"), (fiber.util.SUBDEBUG, "d 2")]


def test_util_fork_aware_objects_behave_as_multiprocessings():
    lock = fiber.util.ForkAwareThreadLock()
    with lock:
        assert not lock.acquire(False)
    assert lock.acquire(False)
    lock.release()
    local = fiber.util.ForkAwareLocal()
    local.x = 1
    assert pickle.loads(pickle.dumps(local)).__dict__ == {}


# -- fiber.reduction ----------------------------------------------------------------------
class _Point:
    def __init__(self, x):
        self.x = x


def _rebuild_point(x):
    return _Point(x + 100)


def test_reduction_register_applies_to_fibers_wire():
    fiber.reduction.register(_Point, lambda p: (_rebuild_point, (p.x,)))
    try:
        assert fiber.reduction.ForkingPickler.loads(
            fiber.reduction.ForkingPickler.dumps(_Point(1))).x == 101
        a, b = fiber.Pipe()
        a.send(_Point(2))
        assert b.recv().x == 102
    finally:
        import copyreg

        copyreg.dispatch_table.pop(_Point, None)
        # multiprocessing's ForkingPickler has register() and no unregister: undone by hand
        fiber.reduction.ForkingPickler._extra_reducers.pop(_Point, None)


def test_send_handle_over_a_unix_socket_or_a_fiber_pipe_and_dupfd():
    a, b = multiprocessing.Pipe()
    rfd, wfd = os.pipe()
    try:
        fiber.reduction.send_handle(a, wfd, os.getpid())
        fd = fiber.reduction.recv_handle(b)
        os.write(fd, b"x")
        os.close(fd)
        assert os.read(rfd, 1) == b"x"
        # over a fiber Pipe, and DupFd (issue #43): the descriptor is duplicated into
        # the receiver (here the same process), as multiprocessing's are
        c, d = fiber.Pipe()
        fiber.reduction.send_handle(c, wfd, os.getpid())
        fd = fiber.reduction.recv_handle(d)
        assert fd != wfd
        os.write(fd, b"y")
        os.close(fd)
        assert os.read(rfd, 1) == b"y"
        fd = fiber.reduction.DupFd(wfd).detach()
        os.write(fd, b"z")
        os.close(fd)
        assert os.read(rfd, 1) == b"z"
        with pytest.raises(NotImplementedError, match="Unix domain socket"):
            fiber.reduction.send_handle(object(), wfd, os.getpid())
    finally:
        os.close(rfd), os.close(wfd)
        a.close(), b.close()
