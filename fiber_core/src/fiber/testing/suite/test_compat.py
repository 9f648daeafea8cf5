"""multiprocessing's pool exceptions across jobs: a task's exception carries a
``multiprocessing.pool.RemoteTraceback`` cause (``fiber.pool.RemoteTraceback`` is that
class), an unpicklable result fails as ``MaybeEncodingError``, an unpicklable argument
raises ``TypeError``; and ``get_context(method).Process`` runs as a job."""

from __future__ import annotations

import multiprocessing.pool
import threading

import pytest

import fiber
import fiber.pool


def fail(x):
    raise KeyError(f"bad {x}")


def unpicklable_result(x):
    return threading.Lock()


def report_method(q):
    # the class of this process, as multiprocessing names a context's Process classes
    # (multiprocessing.context.SpawnProcess...): public, and it records the method
    q.put(type(fiber.current_process()).__name__)


def test_task_exception_has_remote_traceback_cause():
    with fiber.Pool(1) as pool:
        with pytest.raises(KeyError) as info:
            pool.apply(fail, (1,))
        cause = info.value.__cause__
        assert isinstance(cause, fiber.pool.RemoteTraceback)
        assert fiber.pool.RemoteTraceback is multiprocessing.pool.RemoteTraceback
        assert "in fail" in str(cause) and "bad 1" in str(cause)
        with pytest.raises(KeyError) as info:
            pool.map(fail, [2])
        assert isinstance(info.value.__cause__, multiprocessing.pool.RemoteTraceback)


def test_unpicklable_result_is_maybe_encoding_error():
    with fiber.Pool(1) as pool:
        with pytest.raises(fiber.pool.MaybeEncodingError) as info:
            pool.apply(unpicklable_result, (1,))
        assert isinstance(info.value, multiprocessing.pool.MaybeEncodingError)
        assert "Error sending result" in str(info.value)
        assert pool.apply(abs, (-3,)) == 3  # the pool goes on


def test_unpicklable_argument_is_typeerror_as_in_multiprocessing():
    with fiber.Pool(1) as pool, pytest.raises(TypeError):
        pool.apply(abs, (threading.Lock(),))


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_context_process_runs_as_a_job(method):
    q = fiber.Queue()
    p = fiber.get_context(method).Process(target=report_method, args=(q,))
    p.start()
    assert q.get(timeout=120) == {"spawn": "SpawnProcess", "fork": "ForkProcess",
                                  "forkserver": "ForkServerProcess"}[method]
    p.join(60)
    assert p.exitcode == 0
