"""The pools the benchmarks compare, behind one small interface.

A :class:`Contender` knows how to start a *session* of ``n`` workers; a session can
``map`` a function over items (with a chunk size, ``None`` meaning the framework's
default), run one concurrent ``round`` of calls and wait for all of them, ``call`` a
function once and wait, and ``close``. Everything is imported lazily inside the
benchmark's worker process, so a contender that is not installed costs nothing and a
contender that fails to start is reported with its error instead of breaking the run.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bench import baseline

logger = logging.getLogger("fiber.bench")

LOOPBACK = "127.0.0.1"


class Session:
    """A running pool of workers."""

    def map(self, fn: Callable, items: list, chunksize: int | None) -> list:
        raise NotImplementedError

    def round(self, fn: Callable, args: list) -> list:
        """Submit ``fn(a)`` for every ``a`` at once, then wait for all (the RL pattern)."""
        raise NotImplementedError

    def call(self, fn: Callable, arg: Any) -> Any:
        return self.round(fn, [arg])[0]

    def close(self) -> None:
        raise NotImplementedError


class PoolSession(Session):
    """Anything with the ``multiprocessing.Pool`` API (multiprocessing, fiber, Ray's Pool)."""

    def __init__(self, pool: Any, after_close: Callable[[], None] | None = None) -> None:
        self.pool = pool
        self.after_close = after_close

    def map(self, fn: Callable, items: list, chunksize: int | None) -> list:
        return self.pool.map(fn, items, chunksize)

    def round(self, fn: Callable, args: list) -> list:
        handles = [self.pool.apply_async(fn, (a,)) for a in args]
        return [h.get() for h in handles]

    def call(self, fn: Callable, arg: Any) -> Any:
        return self.pool.apply_async(fn, (arg,)).get()

    def close(self) -> None:
        try:
            self.pool.close()
            self.pool.join()
        finally:
            if self.after_close is not None:
                self.after_close()


class ExecutorSession(Session):
    """A ``concurrent.futures`` executor (the standard library's and loky's)."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    def map(self, fn: Callable, items: list, chunksize: int | None) -> list:
        return list(self.executor.map(fn, items, chunksize=chunksize or 1))

    def round(self, fn: Callable, args: list) -> list:
        futures = [self.executor.submit(fn, a) for a in args]
        return [f.result() for f in futures]

    def call(self, fn: Callable, arg: Any) -> Any:
        return self.executor.submit(fn, arg).result()

    def close(self) -> None:
        self.executor.shutdown(wait=True)


class RayTaskSession(Session):
    """Plain Ray remote functions (one task per item; Ray has no chunk size)."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self._remote: dict[Callable, Any] = {}

    def _r(self, fn: Callable) -> Any:
        if fn not in self._remote:
            self._remote[fn] = self.ray.remote(fn)
        return self._remote[fn]

    def map(self, fn: Callable, items: list, chunksize: int | None) -> list:
        r = self._r(fn)
        return self.ray.get([r.remote(x) for x in items])

    def round(self, fn: Callable, args: list) -> list:
        return self.map(fn, args, None)

    def call(self, fn: Callable, arg: Any) -> Any:
        return self.ray.get(self._r(fn).remote(arg))

    def close(self) -> None:
        self.ray.shutdown()


class DaskSession(Session):
    """dask.distributed: a LocalCluster of single-threaded worker processes."""

    def __init__(self, cluster: Any, client: Any) -> None:
        self.cluster = cluster
        self.client = client

    def map(self, fn: Callable, items: list, chunksize: int | None) -> list:
        return self.client.gather(self.client.map(fn, items, pure=False))

    def round(self, fn: Callable, args: list) -> list:
        return self.map(fn, args, None)

    def call(self, fn: Callable, arg: Any) -> Any:
        return self.client.submit(fn, arg, pure=False).result()

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


class IPyParallelSession(Session):
    """ipyparallel: a local cluster of engines behind a load-balanced view."""

    def __init__(self, cluster: Any, client: Any) -> None:
        self.cluster = cluster
        self.client = client
        self.view = client.load_balanced_view()

    def map(self, fn: Callable, items: list, chunksize: int | None) -> list:
        return list(self.view.map_sync(fn, items, chunksize=chunksize or 1))

    def round(self, fn: Callable, args: list) -> list:
        handles = [self.view.apply_async(fn, a) for a in args]
        return [h.get() for h in handles]

    def call(self, fn: Callable, arg: Any) -> Any:
        return self.view.apply_async(fn, arg).get()

    def close(self) -> None:
        self.client.close()
        self.cluster.stop_cluster_sync()


class SparkSession(Session):
    """pyspark: RDD jobs on a ``local[n]`` SparkContext (Python workers forked by Spark)."""

    def __init__(self, sc: Any) -> None:
        self.sc = sc

    def map(self, fn: Callable, items: list, chunksize: int | None) -> list:
        slices = math.ceil(len(items) / chunksize) if chunksize else None
        return self.sc.parallelize(items, slices).map(fn).collect()

    def round(self, fn: Callable, args: list) -> list:
        return self.sc.parallelize(args, len(args)).map(fn).collect()

    def close(self) -> None:
        self.sc.stop()


@dataclass
class Contender:
    """One framework (or one configuration of it) in the comparison."""

    name: str
    module: str  # importable module that must be present
    description: str
    starter: Callable[[int], Session]
    heavy: bool = False  # a runtime with daemons: capped worker counts in --quick
    groups: set[str] = field(default_factory=lambda: {"pool"})
    # put in front of PYTHONPATH for this contender's benchmark processes (a baseline)
    pythonpath: list[str] = field(default_factory=list)

    def missing(self, kind: str = "pool") -> str | None:
        """Why this contender cannot run benchmarks of ``kind`` here, or None."""
        if baseline.is_baseline(self.name):  # its fiber is not this process's
            return baseline.missing(self.name)
        if importlib.util.find_spec(self.module) is None:
            return f"`{self.module}` is not installed (pip install -r bench/requirements-full.txt)"
        if self.name.startswith("fiber") and kind != "startup":  # startup: importing it
            need = "Process" if kind == "ipc" else "Pool"
            if not _fiber_has(need):
                return f"fiber.{need} does not exist yet in this checkout"
        return None

    def start(self, n: int) -> Session:
        return self.starter(n)


def _fiber_has(attr: str) -> bool:
    try:
        import fiber
    except ImportError:
        return False
    return hasattr(fiber, attr)


def _start_mp(method: str) -> Callable[[int], Session]:
    def start(n: int) -> Session:
        import multiprocessing

        return PoolSession(multiprocessing.get_context(method).Pool(n))

    return start


def _start_fiber(n: int) -> Session:
    import fiber

    pool_cls = getattr(fiber, "Pool", None)
    if pool_cls is None:
        from fiber.pool import Pool as pool_cls
    return PoolSession(pool_cls(n))


def _start_cf(n: int) -> Session:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ExecutorSession(ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")))


def _start_loky(n: int) -> Session:
    import loky

    return ExecutorSession(loky.ProcessPoolExecutor(max_workers=n))


def _ray_init(n: int) -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False,
             _node_ip_address=LOOPBACK, object_store_memory=512 * 2**20,
             logging_level=logging.ERROR)
    return ray


def _start_ray_pool(n: int) -> Session:
    ray = _ray_init(n)
    from ray.util.multiprocessing import Pool

    return PoolSession(Pool(processes=n), after_close=ray.shutdown)


def _start_ray_tasks(n: int) -> Session:
    return RayTaskSession(_ray_init(n))


def _start_dask(n: int) -> Session:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                           host=LOOPBACK, dashboard_address=None,
                           silence_logs=logging.ERROR)
    return DaskSession(cluster, Client(cluster))


def _start_ipp(n: int) -> Session:
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=n, log_level=logging.ERROR, controller_ip=LOOPBACK)
    client = cluster.start_and_connect_sync(activate=False)
    client.wait_for_engines(n, timeout=600)
    return IPyParallelSession(cluster, client)


def _start_spark(n: int) -> Session:
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster(f"local[{n}]").setAppName("fiber-bench")
            .set("spark.ui.enabled", "false")
            .set("spark.driver.host", LOOPBACK)
            .set("spark.driver.bindAddress", LOOPBACK)
            .set("spark.python.worker.reuse", "true"))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    return SparkSession(sc)


def fiber_name() -> str:
    """``fiber`` on the local backend, ``fiber[<backend>]`` on any other."""
    backend = os.environ.get("FIBER_BACKEND", "local")
    return "fiber" if backend == "local" else f"fiber[{backend}]"


def all_contenders() -> list[Contender]:
    """Every contender the harness knows, fiber first, multiprocessing (fork) second."""
    return [
        Contender(fiber_name(), "fiber", "fiber.Pool (job-backed processes)", _start_fiber,
                  groups={"pool", "scale"}),
        Contender("mp-fork", "multiprocessing", "multiprocessing.Pool, fork context",
                  _start_mp("fork"), groups={"pool", "scale"}),
        Contender("mp-spawn", "multiprocessing", "multiprocessing.Pool, spawn context",
                  _start_mp("spawn"), groups={"pool", "scale"}),
        Contender("concurrent.futures", "concurrent.futures",
                  "ProcessPoolExecutor (fork)", _start_cf, groups={"pool", "scale"}),
        Contender("loky", "loky", "loky.ProcessPoolExecutor", _start_loky,
                  groups={"pool", "scale"}),
        Contender("ray-pool", "ray", "ray.util.multiprocessing.Pool", _start_ray_pool,
                  heavy=True),
        Contender("ray-tasks", "ray", "plain Ray tasks (@ray.remote)", _start_ray_tasks,
                  heavy=True),
        Contender("dask", "distributed", "dask.distributed LocalCluster (1 thread/worker)",
                  _start_dask, heavy=True),
        Contender("ipyparallel", "ipyparallel", "ipyparallel load-balanced view",
                  _start_ipp, heavy=True),
        Contender("pyspark", "pyspark", "pyspark RDD on local[n]", _start_spark, heavy=True),
    ]


def baseline_contender(name: str) -> Contender:
    """``fiber@REV``: fiber.Pool exactly as the ``fiber`` contender, with the fiber of
    the baseline tree that bench/baseline.py made for REV (``--baseline REV``)."""
    short = name[len(baseline.PREFIX):]
    return Contender(name, "fiber", f"fiber.Pool of commit {short} ({baseline.tree(short)})",
                     _start_fiber, groups={"pool", "scale"},
                     pythonpath=baseline.pythonpath(name))


def by_name(names: Iterable[str] | None = None) -> list[Contender]:
    """The contenders named (all when ``names`` is None); unknown names are an error,
    but for baselines (``fiber@REV``, whose tree ``--baseline REV`` makes)."""
    known = all_contenders()
    if names is None:
        return known
    table = {c.name: c for c in known}
    # "fiber" always selects fiber, whatever the backend.
    table.setdefault("fiber", known[0])
    wanted = []
    for n in names:
        if baseline.is_baseline(n) and n not in table:
            wanted.append(baseline_contender(n))
            continue
        if n not in table:
            raise ValueError(f"unknown contender {n!r}; choose from {', '.join(table)}")
        wanted.append(table[n])
    return wanted
