"""Programs written for uber/fiber 0.2 run: its settings, ``Pool`` arguments and
methods, ``fiber.experimental.Ring`` and ``fiber.reset()`` work, each old spelling
with one DeprecationWarning naming the new one; and programs in the shape of its
documented examples (``tests/uber_examples``) run unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import fiber
from fiber.errors import ConfigError
from fiber.runtime import config

EXAMPLES = Path(__file__).parent.parent / "uber_examples"


@pytest.fixture
def fresh_warnings():
    """Forget which deprecations were already reported in this process."""
    from fiber import util

    # private: the warn-once registry has no public reset (a program never needs one)
    util._warned.clear()
    yield
    util._warned.clear()


def test_old_settings_in_code_map_to_new_ones(fresh_config, fresh_warnings):
    with pytest.warns(DeprecationWarning) as caught:
        cfg = fiber.init(cpu_per_job=2, mem_per_job=512, default_backend="local",
                         default_image="img:1", log_file="stdout", merge_output=True)
    assert (cfg.cpu, cfg.memory, cfg.backend, cfg.image) == (2.0, 512, "local", "img:1")
    text = "\n".join(str(w.message) for w in caught)
    for old, new in [("cpu_per_job", "'cpu'"), ("mem_per_job", "'memory'"),
                     ("default_backend", "'backend'"), ("default_image", "'image'"),
                     ("log_file", "ignored"), ("merge_output", "ignored")]:
        assert f"'{old}'" in text and new in text, (old, text)
    # attributed to this caller, not to fiber's code
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}
    # once per spelling
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fiber.init(cpu_per_job=3)
    assert config.get_config().cpu == 3.0


def test_new_spelling_wins_and_debug_and_numeric_log_level(fresh_config, fresh_warnings):
    import logging

    with pytest.warns(DeprecationWarning):
        cfg = fiber.init(cpu=4, cpu_per_job=2, debug=True)
    assert cfg.cpu == 4.0 and cfg.log_level == "DEBUG"
    cfg = fiber.init(debug=False, log_level=logging.INFO)
    assert cfg.log_level == "INFO"
    fiber.reset()
    assert config.get_config().log_level == "WARNING"
    assert config.get_config().cpu is None


def test_old_settings_from_the_environment(fresh_config, fresh_warnings, monkeypatch):
    monkeypatch.setenv("FIBER_CPU_PER_JOB", "2")
    monkeypatch.setenv("FIBER_DEFAULT_BACKEND", "local")
    monkeypatch.setenv("FIBER_LOG_LEVEL", "debug")
    with pytest.warns(DeprecationWarning) as caught:
        cfg = config.get_config()
    assert sorted(str(w.message).split()[2] for w in caught) == [
        "'cpu_per_job'", "'default_backend'"]
    assert all("(from the environment)" in str(w.message) for w in caught)
    assert (cfg.cpu, cfg.backend, cfg.log_level) == (2.0, "local", "DEBUG")
    assert cfg.child_env()["FIBER_CPU"] == "2.0"  # children get the new spelling
    config.reset()
    monkeypatch.setenv("FIBER_CPU_PER_JOB", "many")
    with pytest.raises(ConfigError, match="cpu"):
        config.get_config()


def _square(x):
    return x * x


def test_pool_error_handling_and_worker_methods(fresh_warnings):
    with pytest.warns(DeprecationWarning, match="error_handling"):
        pool = fiber.Pool(2, error_handling=True)
    try:
        with pytest.warns(DeprecationWarning, match="start_workers"):
            pool.start_workers()
        with pytest.warns(DeprecationWarning, match=r"stats\(\)"):
            pool.wait_until_workers_up(timeout=60)
        stats = pool.stats()
        assert stats.starting == 0 and stats.idle + stats.busy == 2
        assert pool.map(_square, range(5)) == [0, 1, 4, 9, 16]
    finally:
        pool.terminate()
        pool.join()


def test_experimental_ring_is_fibers_ring(fresh_warnings):
    import fiber.experimental

    with pytest.warns(DeprecationWarning, match="use fiber.Ring"):
        ring = fiber.experimental.Ring
    # (fiber.Ring is the default context's factory, as multiprocessing's names are;
    # the class is fiber.ring.Ring, which uber/fiber's fiber.experimental.Ring was)
    import fiber.ring

    assert ring is fiber.ring.Ring
    from fiber.experimental import Ring  # no second warning

    assert Ring is fiber.ring.Ring


def test_deprecation_shown_to_a_script_by_default(run_script):
    """Python shows a DeprecationWarning by default only when it is attributed to
    ``__main__``: fiber's are, so a user of the old spelling sees it, once."""
    result = run_script(
        """
        import fiber

        def f(x):
            return x + 1

        if __name__ == "__main__":
            fiber.init(cpu_per_job=1)
            fiber.init(cpu_per_job=1)
            with fiber.Pool(1, error_handling=True) as pool:
                print(pool.apply(f, (1,)))
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"
    assert result.stderr.count("DeprecationWarning") == 2, result.stderr
    assert "'cpu_per_job' (from fiber.init()) is deprecated: use 'cpu'" in result.stderr
    assert "error_handling" in result.stderr


@pytest.mark.parametrize("script, expected", [
    ("ex_process.py", ["hello fiber from a fiber process", "exitcode 0"]),
    ("ex_queue.py", ["doubled [0, 2, 4, 6, 8]"]),
    ("ex_pi.py", [None, "within 0.1: True"]),
    ("ex_manager.py", ["shared [(0, 0), (1, 1), (2, 4)]"]),
    ("ex_async_manager.py", ["stepped [1, 11, 21, 31] True"]),
])
def test_uber_fiber_examples_run_unchanged(script, expected, tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                            text=True, timeout=180, cwd=tmp_path,
                            env={**os.environ, "FIBER_BACKEND": "local"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(expected), (result.stdout, result.stderr)
    for line, want in zip(lines, expected, strict=True):
        assert want is None or line == want, (result.stdout, result.stderr)
    assert "Warning" not in result.stderr, result.stderr  # an ordinary run warns not


@pytest.mark.parametrize("script, expected, spellings", [
    ("ex_config_in_code.py", ["queued 42 local local", "squares [0, 1, 4, 9, 16]"],
     ["fiber.config.log_level is deprecated: use fiber.init(log_level=...)",
      "'log_file' (from fiber.init()) is deprecated: ignored",
      "'use_push_queue' (from fiber.init()) is deprecated: ignored",
      "fiber.config.get_dict() is deprecated"]),
    ("ex_old_names.py", ["pipe 42 True", "queue SimpleQueuePush", "queue SimpleQueue",
                         "pool [1, 8, 27]", "pool [1, 8, 27]", "config local",
                         "listen 127.0.0.1 0 True"],
     ["fiber.queues.Pipe is deprecated: use fiber.Pipe",
      "fiber.queues.SimpleQueuePush is deprecated: use fiber.SimpleQueue",
      "fiber.queues.ZConnection is deprecated: use fiber.connection.Connection",
      "fiber.pool.ResilientZPool is deprecated: use fiber.Pool",
      "fiber.config.Config is deprecated",
      "fiber.backend.get_backend() is deprecated: use fiber.runtime.run.backend()"]),
])
def test_uber_fiber_old_names_run_unchanged_and_say_the_new_ones(script, expected,
                                                                 spellings, tmp_path):
    """uber/fiber 0.2's settings module (fiber.config) and its classes' old paths
    work; each spelling shows one DeprecationWarning naming the new one."""
    result = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                            text=True, timeout=180, cwd=tmp_path,
                            env={**os.environ, "FIBER_BACKEND": "local"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected, (result.stdout, result.stderr)
    for spelling in spellings:
        assert spelling in result.stderr, (spelling, result.stderr)


def test_uber_fiber_ring_example_runs_unchanged(tmp_path):
    """uber/fiber's Ring example in small (``tests/uber_examples/ex_ring.py``): its
    initializer takes the ring (``init(ring)``: rank, size, ``members[0]``'s ip and
    port), asks ``get_backend().get_listen_addr()`` for the interface and joins a real
    torch.distributed gloo group; both members all-reduce. Before, fiber called the
    initializer with no argument (TypeError in every member)."""
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, str(EXAMPLES / "ex_ring.py")],
                            capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env={**os.environ, "FIBER_BACKEND": "local"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the members print in either order, each before the ring ends
    assert sorted(lines[:2]) == ["rank 0 of 2 sum [3.0, 2.0]",
                                 "rank 1 of 2 sum [3.0, 2.0]"], (result.stdout, result.stderr)
    assert lines[2:] == ["ring done"], (result.stdout, result.stderr)
    for spelling in ["fiber.experimental.Ring is deprecated: use fiber.Ring",
                     "a Ring initializer taking the ring (ring_init(ring), uber/fiber's "
                     "form) is deprecated: fiber.Ring calls initializer(*initargs)",
                     "fiber.backend.get_backend() is deprecated"]:
        assert spelling in result.stderr, (spelling, result.stderr)


def test_a_ring_initializer_of_fibers_form_is_called_with_initargs():
    """Which form an initializer is decides by what can be called: fiber's
    (``*initargs``) whenever it can, uber/fiber's (one argument, no initargs) only
    when fiber's cannot."""
    from fiber.uber_ring import takes_the_ring

    def fibers(*args):
        pass

    def optional(ring=None):
        pass

    def ubers(ring):
        pass

    def two(a, b):
        pass

    assert not takes_the_ring(fibers, ())
    assert not takes_the_ring(optional, ())
    assert takes_the_ring(ubers, ())
    assert not takes_the_ring(ubers, (1,))
    assert not takes_the_ring(two, ())
    assert not takes_the_ring(print, ())


@fiber.meta(gpu=1)
def _gpu_member(rank, world_size):
    return rank


def test_a_ring_members_jobs_ask_for_what_its_func_requests():
    """uber/fiber's Ring example asks a GPU per member with ``@fiber.meta(gpu=1)`` on
    the ring's function: the members' jobs ask for it (uber/fiber's Ring passed the
    function's requests on). The local backend has no GPUs, so ``run()`` raises its
    ConfigError at once, no member left. Before, the request was dropped silently and
    the ring ran."""
    import fiber.ring

    ring = fiber.ring.Ring(2, _gpu_member)
    with pytest.raises(ConfigError, match="cannot honour a gpu request"):
        ring.run(timeout=120)
    assert not any(member.is_alive() for member in ring.members)


def test_fiber_config_reads_uber_fibers_types_and_defaults(fresh_config, fresh_warnings):
    """uber/fiber's programs read ``fiber.config.cpu_per_job`` (an int, 1 by default)
    and ``fiber.config.log_level`` (a logging level number); fiber's own settings keep
    theirs. Before: None and "WARNING"."""
    import logging

    import fiber.config as fiber_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert (fiber_config.cpu_per_job, fiber_config.log_level) == (1, logging.WARNING)
        assert fiber_config.use_push_queue is True  # uber/fiber's default, ignored here
        fiber_config.log_level = "info"
        fiber_config.cpu_per_job = 2
        assert fiber_config.log_level == logging.INFO
        assert fiber_config.cpu_per_job == 2 and type(fiber_config.cpu_per_job) is int
        old = fiber_config.get_object()
        assert (old.cpu_per_job, old.log_level) == (2, logging.INFO)
        assert fiber_config.get_dict()["log_level"] == logging.INFO
    # fiber's own view is unchanged: level names, cores as a number
    assert (config.get_config().log_level, config.get_config().cpu) == ("INFO", 2.0)


def where(_):
    """(this worker's pid, its job's pid) after 20 ms."""
    import time

    time.sleep(0.02)
    return os.getpid(), os.getppid()


def _jobs_of(pool):
    """{job pid: (its workers, its request as (cpu, memory))}."""
    jobs = {}
    for w in pool.stats().workers:
        spec = w.process.job.spec
        jobs.setdefault(w.process.pid, [0, (spec.cpu, spec.memory)])[0] += 1
    return {pid: tuple(v) for pid, v in jobs.items()}


def test_cpu_per_job_packs_pool_workers_into_jobs_as_uber_fiber_did(fresh_config,
                                                                      fresh_warnings):
    """uber/fiber 0.2 with ``cpu_per_job=2``: ``Pool(4)`` ran two jobs of two workers,
    each job asking for 2 cores (and ``mem_per_job``). Before: four jobs of one worker,
    each asking for 2 cores. fiber's own ``cpu`` keeps its meaning (every job, so every
    worker, gets that many); a pool that names ``workers_per_job`` or a cpu request is
    taken at its word."""
    with pytest.warns(DeprecationWarning):
        fiber.init(cpu_per_job=2, mem_per_job=512)
    with fiber.Pool(4) as pool:
        ran = pool.map(where, range(40), chunksize=1)
        assert sorted(_jobs_of(pool).values()) == [(2, (2.0, 512))] * 2
        # each job's workers are its own children (a job of one worker is a child of
        # the local backend's template)
        assert {ppid for _, ppid in ran} == set(_jobs_of(pool))
    with fiber.Pool(2, workers_per_job=1) as pool:
        pool.map(where, range(4), chunksize=1)
        assert sorted(_jobs_of(pool).values()) == [(1, (2.0, 512))] * 2
    fiber.init(cpu=2, memory=512)  # fiber's names: a job per worker, as asked
    with fiber.Pool(2) as pool:
        pool.map(where, range(4), chunksize=1)
        assert sorted(_jobs_of(pool).values()) == [(1, (2.0, 512))] * 2


def _push_reader(q, control, out, read_at_once):
    """Join ``q``'s readers (a get that finds nothing), say so, then read: at once, or
    when ``control`` says; report what was read, until a get finds nothing for 2 s."""
    import queue as std_queue

    try:
        q.get(timeout=0)
    except std_queue.Empty:
        pass
    out.put("joined")
    if not read_at_once:
        control.get(timeout=60)
    got = []
    while True:
        try:
            got.append(q.get(timeout=2))
        except std_queue.Empty:
            break
    out.put(got)


def test_simple_queue_push_pushes_round_robin_as_uber_fiber_did(fresh_warnings):
    """uber/fiber's SimpleQueuePush gave items to its readers in turn: an item waits for
    its reader even while another is idle. Two readers, one not reading yet: the reading
    one gets every other item, not all of them (before: all 6, SimpleQueue's semantics);
    the other one gets the rest when it reads."""
    with pytest.warns(DeprecationWarning, match="SimpleQueuePush is deprecated"):
        from fiber.queues import SimpleQueuePush

        q = SimpleQueuePush()
    control, out_a, out_b = fiber.SimpleQueue(), fiber.SimpleQueue(), fiber.SimpleQueue()
    a = fiber.Process(target=_push_reader, args=(q, control, out_a, False))
    b = fiber.Process(target=_push_reader, args=(q, control, out_b, True))
    for p, out in ((a, out_a), (b, out_b)):  # a joins the turn first, then b
        p.start()
        assert out.get(timeout=60) == "joined"
    for i in range(6):
        q.put(i)
    got_b = out_b.get(timeout=60)
    control.put("read")
    got_a = out_a.get(timeout=60)
    a.join(60)
    b.join(60)
    assert (a.exitcode, b.exitcode) == (0, 0)
    assert (got_a, got_b) == ([0, 2, 4], [1, 3, 5])


def _push_leaver(q, out, control):
    import queue as std_queue

    try:
        q.get(timeout=0)
    except std_queue.Empty:
        pass
    out.put("joined")
    control.get(timeout=60)  # leaves when told, its share unread


def test_simple_queue_push_gives_a_gone_readers_items_to_the_others(fresh_warnings):
    """A reader that leaves without reading its share: uber/fiber lost those items;
    fiber gives them to the readers left (here this process), nothing dropped."""
    with pytest.warns(DeprecationWarning):
        from fiber.queues import SimpleQueuePush

        q = SimpleQueuePush()
    out, control = fiber.SimpleQueue(), fiber.SimpleQueue()
    try:
        q.get(timeout=0)  # this process joins the turn first
    except Exception:  # noqa: BLE001 - queue.Empty
        pass
    leaver = fiber.Process(target=_push_leaver, args=(q, out, control))
    leaver.start()
    assert out.get(timeout=60) == "joined"
    for i in range(4):
        q.put(i)
    assert [q.get(timeout=10) for _ in range(2)] == [0, 2]  # this process's share
    control.put("leave")
    leaver.join(60)
    assert leaver.exitcode == 0
    assert sorted(q.get(timeout=30) for _ in range(2)) == [1, 3]  # the leaver's
