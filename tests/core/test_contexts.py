"""A backend per context and resources per process and per pool, on the local backend:
contexts of one backend with different setting overrides get backend instances of
their own and their jobs get their own settings; ``Pool(context=)`` honours the
context; resource requests are merged (settings < ``@fiber.meta`` < ``resources=``),
reach the job's spec, and what the backend cannot honour is refused before any job
starts. Real jobs (local subprocesses) throughout."""

from __future__ import annotations

import multiprocessing

import pytest

import fiber
from fiber.backend import ConfigError, Resources
from fiber.context import BackendContext


def _report(queue):
    queue.put((fiber.get_config_value("backend"), fiber.get_config_value("cpu"),
               fiber.get_config_value("output_prefix")))


def _setting(_):
    return fiber.get_config_value("cpu")


def test_method_names_keep_multiprocessing_semantics():
    for method in ("spawn", "fork", "forkserver"):
        ctx = fiber.get_context(method)
        assert ctx.get_start_method() == method
        assert ctx is fiber.get_context(method)
        assert not isinstance(ctx, BackendContext)
    with pytest.raises(ValueError, match="cannot find context for 'nosuchthing'"):
        fiber.get_context("nosuchthing")


def test_backend_contexts_are_one_per_name_and_overrides():
    a = fiber.get_context("local", cpu=2)
    assert a is fiber.get_context("local", cpu=2)
    b = fiber.get_context("local", cpu=3)
    assert a is not b and a.backend == b.backend == "local"
    assert a.get_start_method() == "spawn"
    assert fiber.get_context("fork", cpu=2).get_start_method() == "fork"
    # separate backend instances, and the default one is neither
    backends = {id(a.run_target().backend()), id(b.run_target().backend()),
                id(fiber.get_context("local").run_target().backend())}
    assert len(backends) == 3


def test_overrides_are_validated_and_errors_name_the_setting():
    with pytest.raises(ConfigError, match="unknown setting 'cpuu'.*did you mean 'cpu'"):
        fiber.get_context("local", cpuu=2)
    with pytest.raises(ConfigError, match="cpu"):
        fiber.get_context("local", cpu="many")


def test_each_context_s_jobs_get_its_own_settings():
    two = fiber.get_context("local", cpu=2, output_prefix=True)
    three = fiber.get_context("local", cpu=3)
    q2, q3 = two.Queue(), three.Queue()
    p2 = two.Process(target=_report, args=(q2,))
    p3 = three.Process(target=_report, args=(q3,))
    p2.start()
    p3.start()
    assert q2.get(timeout=120) == ("local", 2.0, True)
    assert q3.get(timeout=120) == ("local", 3.0, False)
    p2.join(60)
    p3.join(60)
    assert (p2.exitcode, p3.exitcode) == (0, 0)
    # private read: a Process shows its job, not the backend instance, which only its Popen holds
    assert p2._popen is None or p2._popen.backend is two.run_target().backend()
    # a context's Process is still fiber's (and multiprocessing's API)
    assert issubclass(two.Process, fiber.Process)


def test_pool_honours_its_context():
    ctx = fiber.get_context("local", cpu=4)
    with fiber.Pool(2, context=ctx) as pool:
        assert pool.map(_setting, range(4)) == [4.0] * 4
    with ctx.Pool(1) as pool:
        assert pool.apply(_setting, (0,)) == 4.0
    # a multiprocessing context is accepted as before: the current backend
    with fiber.Pool(1, context=multiprocessing.get_context("spawn")) as pool:
        assert pool.apply(_setting, (0,)) == fiber.get_config_value("cpu")


@fiber.meta(cpu=2, memory="1G")
def _sleep_briefly():
    import time

    time.sleep(0.5)


def test_resources_merge_and_reach_the_job_spec():
    p = fiber.Process(target=_sleep_briefly, resources={"memory": "2G"})
    p.start()
    try:
        spec = p.job.spec
        assert (spec.cpu, spec.memory, spec.gpu, spec.walltime) == (2.0, 2048, None, None)
        assert spec.extra == {}
    finally:
        p.join(60)
    assert p.exitcode == 0


def test_resources_values_are_checked_when_made():
    assert Resources(memory="4G", walltime="1-00:30").memory == 4096
    assert Resources(walltime="1-00:30").walltime == 24 * 3600 + 30 * 60
    assert Resources(walltime="10:00").walltime == 600
    assert Resources(walltime="1:00:00").walltime == 3600
    with pytest.raises(ConfigError, match="walltime"):
        Resources(walltime="soon")
    with pytest.raises(ConfigError, match="memory"):
        Resources(memory="lots")
    with pytest.raises(ConfigError, match="unknown resource request 'cpus'"):
        fiber.Process(target=print, resources={"cpus": 2})
    with pytest.raises(ConfigError, match="walltime"):
        fiber.meta(walltime=-1)


def test_what_the_backend_cannot_honour_is_refused_before_any_job_starts():
    before = set(fiber.active_children())
    with pytest.raises(ConfigError, match="local backend cannot honour a gpu request"):
        fiber.Pool(2, resources={"gpu": 1})
    with pytest.raises(ConfigError, match=r"does not know the resource request "
                                          r"extra\['local'\]\['partition'\]"):
        fiber.Pool(2, resources=Resources(extra={"local": {"partition": "debug"}}))
    p = fiber.Process(target=print, resources=Resources(walltime=60))
    with pytest.raises(ConfigError, match="local backend cannot honour a walltime request"):
        p.start()
    assert p.pid is None
    assert set(fiber.active_children()) == before
    # another backend's extras are not the local backend's business
    with fiber.Pool(1, resources=Resources(extra={"slurm": {"partition": "debug"}})) as pool:
        assert pool.apply(_setting, (0,)) == fiber.get_config_value("cpu")


def test_the_local_backend_says_what_it_does_with_requests(monkeypatch, caplog):
    """Its refusal of a GPU does not claim that it honours cpu and memory (it
    enforces neither); a job that asks for memory is run, with one warning per
    process that says the request is not enforced."""
    import logging

    from fiber.backend.local import backend as local

    with pytest.raises(ConfigError) as refused:
        fiber.Pool(2, resources={"gpu": 1})
    message = str(refused.value)
    assert "local backend cannot honour a gpu request (1)" in message
    assert "honours cpu, memory" not in message
    assert "cpu and memory requests are accepted but not enforced" in message
    monkeypatch.setattr(local, "_warned_not_enforced", False)
    caplog.set_level(logging.WARNING, logger="fiber")
    for _ in range(2):
        p = fiber.Process(target=print, resources=Resources(memory="64M", cpu=1))
        p.start()
        p.join(60)
        assert p.exitcode == 0
    warned = [r.getMessage() for r in caplog.records
              if r.name == "fiber" and "does not enforce" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "cpu=1.0, memory=64 MiB" in warned[0]


# -- the context is the one carrier of its target (issue #27) ---------------------------

def _member_setting(rank, world_size):
    return fiber.get_config_value("cpu")


def _settings_in_server():
    return {"cpu": fiber.get_config_value("cpu")}


def test_a_context_s_ring_members_are_its_processes():
    """ctx.Ring's members run on the context's target with its settings (they are
    started by Ring.run(), after ctx.Ring() has returned)."""
    ctx = fiber.get_context("local", cpu=3)
    assert ctx.Ring(2, _member_setting).run(timeout=300) == [3.0, 3.0]


def test_a_manager_given_a_context_starts_its_server_there():
    """A manager made with ``ctx=`` (as multiprocessing's BaseManager takes it) runs
    its server as a job of that context, with its settings."""
    from fiber.managers import BaseManager

    class Settings(BaseManager):
        pass

    Settings.register("settings", _settings_in_server, exposed=("get",))
    manager = Settings(ctx=fiber.get_context("local", cpu=3))
    manager.start()
    try:
        assert manager.settings().get("cpu") == 3.0
    finally:
        manager.shutdown()


def test_a_backend_context_pickles_as_its_name_and_overrides():
    """What a job receives of a context (a Process class of it carries it) is its
    backend name, start method and overrides: never the parent's target, whose
    backend instance and hub are this process's."""
    import pickle

    ctx = fiber.get_context("local", cpu=2)
    ctx.run_target().backend()  # this process's, made
    data = pickle.dumps(ctx)
    assert b"Target" not in data and b"LocalBackend" not in data
    assert pickle.loads(data) is ctx  # in the same process: the same context


def test_set_start_method_takes_start_methods_only():
    """The default context's jobs follow the backend setting: a backend name given to
    set_start_method is refused (it changed nothing the default context made)."""
    try:
        with pytest.raises(ValueError, match="cannot find context for 'local'") as info:
            fiber.set_start_method("local", force=True)
        assert "fiber.init(backend='local')" in "".join(getattr(info.value, "__notes__", []))
        assert fiber.get_start_method() == "spawn"
    finally:
        fiber.set_start_method(None, force=True)
