"""Evolution strategies (OpenAI-ES) on gymnasium's CartPole-v1 with a fiber Pool.

The population of perturbed policies is evaluated in parallel by ``fiber.Pool``: on
this machine by default, on a cluster by setting ``FIBER_BACKEND`` (docker, ssh,
slurm, kubernetes) -- the script does not change. The OpenAI-ES ingredients:

* a *shared noise table*: every worker builds the same table of Gaussian noise from a
  seed, so a task carries only an index into it, never the perturbation itself;
* *antithetic sampling*: each task runs the pair theta + sigma*eps and theta - sigma*eps
  on the same episode seed;
* *rank-normalized fitness*: returns are replaced by centered ranks in [-0.5, 0.5].

The policy is a small numpy network (linear by default, ``--hidden N`` adds a tanh
layer). Run ``python examples/es.py`` to train, ``python examples/es.py --plot`` to
compare 1, 2 and 5 workers (writes bench/results/es.png: reward against wall time, each
run from its own start, and the time to reach a reward threshold against the number
of workers; ``python -m bench es`` runs the same from the benchmark suite). Needs
``pip install -r examples/requirements.txt`` (gymnasium; matplotlib for ``--plot``).

``--adapt SECONDS`` runs the population on an adaptive pool (``Pool.adapt``, docs/adapt.md):
once its workers are up, the pool keeps between 0 and ``--workers`` of them, gives back
those idle longer than ``SECONDS`` (during a long learner step, between iterations) and
starts them again for the next population; the rewards are the same as with a fixed
pool (the tasks do not depend on the worker that runs them).

Each run's clock starts once its pool's workers are up (they import gymnasium and build
the noise table in the pool's initializer); the start-up is measured apart
(``startup_seconds`` of each record), since it depends on the machine and the backend,
not on ES.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import fiber as mp

ENV_ID = "CartPole-v1"
NOISE_SEED = 123
NOISE_SIZE = 1_000_000
OBS_DIM, N_ACTIONS = 4, 2

_noise: np.ndarray | None = None  # this process's copy of the shared noise table


def noise_table() -> np.ndarray:
    """The shared noise table (built once per process from a fixed seed)."""
    global _noise
    if _noise is None:
        _noise = np.random.default_rng(NOISE_SEED).standard_normal(NOISE_SIZE).astype(np.float32)
    return _noise


def n_params(hidden: int) -> int:
    if hidden == 0:
        return OBS_DIM * N_ACTIONS + N_ACTIONS
    return OBS_DIM * hidden + hidden + hidden * N_ACTIONS + N_ACTIONS


def act(theta: np.ndarray, obs: np.ndarray, hidden: int) -> int:
    """The policy: the argmax of a linear (or one-hidden-layer tanh) network's logits."""
    if hidden == 0:
        w = theta[: OBS_DIM * N_ACTIONS].reshape(N_ACTIONS, OBS_DIM)
        return int(np.argmax(w @ obs + theta[OBS_DIM * N_ACTIONS:]))
    i = OBS_DIM * hidden
    w1, b1 = theta[:i].reshape(hidden, OBS_DIM), theta[i:i + hidden]
    i += hidden
    w2 = theta[i:i + hidden * N_ACTIONS].reshape(N_ACTIONS, hidden)
    b2 = theta[i + hidden * N_ACTIONS:]
    return int(np.argmax(w2 @ np.tanh(w1 @ obs + b1) + b2))


def episode(theta: np.ndarray, seed: int, max_steps: int, hidden: int) -> float:
    """Total reward of one episode of the policy ``theta``."""
    import gymnasium as gym

    env = gym.make(ENV_ID, max_episode_steps=max_steps)
    try:
        obs, _ = env.reset(seed=seed)
        total = 0.0
        for _ in range(max_steps):
            obs, reward, terminated, truncated, _ = env.step(act(theta, obs, hidden))
            total += float(reward)
            if terminated or truncated:
                break
        return total
    finally:
        env.close()


def evaluate(task: tuple) -> tuple[float, float]:
    """Worker: returns of the antithetic pair theta +/- sigma * noise[index:index+dim]."""
    theta, index, sigma, seed, max_steps, hidden = task
    eps = noise_table()[index:index + theta.size]
    return (episode(theta + sigma * eps, seed, max_steps, hidden),
            episode(theta - sigma * eps, seed, max_steps, hidden))


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of ``x`` scaled to [-0.5, 0.5] (same shape)."""
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[x.ravel().argsort()] = np.arange(x.size)
    return (ranks / (x.size - 1) - 0.5).reshape(x.shape)


class Adam:
    """The Adam optimizer (ascending the ES gradient estimate)."""

    def __init__(self, dim: int, lr: float, beta1: float = 0.9, beta2: float = 0.999) -> None:
        self.lr, self.b1, self.b2 = lr, beta1, beta2
        self.m, self.v, self.t = np.zeros(dim), np.zeros(dim), 0

    def step(self, grad: np.ndarray) -> np.ndarray:
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad * grad
        lr = self.lr * np.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
        return lr * self.m / (np.sqrt(self.v) + 1e-8)


def warm() -> None:
    """Pool initializer: what every worker needs, done before it takes tasks."""
    import gymnasium  # noqa: F401

    noise_table()


def wait_for_workers(pool: mp.Pool, workers: int, timeout: float = 600) -> None:
    """Until every worker of ``pool`` is up (has run its initializer and connected)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = pool.stats()
        if stats.broken is not None:  # its workers cannot start: say why, at once
            raise stats.broken
        if stats.idle + stats.busy >= workers:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{stats.starting} of {workers} workers still starting")
        time.sleep(0.01)


def train(workers: int, iterations: int, population: int, sigma: float = 0.1,
          lr: float = 0.05, max_steps: int = 500, hidden: int = 0, seed: int = 0,
          weight_decay: float = 0.005, log: bool = True,
          adapt: float | None = None, journal: str | None = None) -> list[dict]:
    """Run OpenAI-ES; returns one record per iteration (mean/max population reward,
    wall time since the workers were up, the time they took to start, and the workers
    the pool has started so far; the last record also has the final parameters,
    ``theta``). ``adapt``: the idle timeout of an adaptive pool of 0 to ``workers``
    workers (None: a fixed pool). ``journal``: a durable pool's journal
    (docs/durable.md): a run that crashed, run again with the same journal and seed,
    replays the iterations the journal holds and goes on from there."""
    if population < 2 or population % 2:
        raise ValueError(f"population must be an even number >= 2 (antithetic pairs), got {population}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    rng = np.random.default_rng(seed)
    dim = n_params(hidden)
    theta = rng.standard_normal(dim) * 0.1
    noise = noise_table()
    opt = Adam(dim, lr)
    pairs = population // 2
    history = []
    started = time.perf_counter()
    with mp.Pool(workers, initializer=warm, journal=journal) as pool:
        wait_for_workers(pool, workers)
        t0 = time.perf_counter()
        startup = t0 - started
        if log:
            print(f"{workers} worker(s) up in {startup:.2f} s", flush=True)
        if adapt is not None:
            pool.adapt(minimum=0, maximum=workers, idle_timeout=adapt)
            if log:
                print(f"adaptive pool: 0 to {workers} workers, idle timeout {adapt:g} s",
                      flush=True)
        for it in range(iterations):
            indices = rng.integers(0, NOISE_SIZE - dim, size=pairs)
            seeds = rng.integers(0, 2**31 - 1, size=pairs)
            tasks = [(theta, int(i), sigma, int(s), max_steps, hidden)
                     for i, s in zip(indices, seeds, strict=True)]
            returns = np.array(pool.map(evaluate, tasks, chunksize=1))  # shape (pairs, 2)
            ranks = centered_ranks(returns)
            eps = np.stack([noise[i:i + dim] for i in indices])
            grad = (ranks[:, 0] - ranks[:, 1]) @ eps / (pairs * sigma)
            theta = theta + opt.step(grad - weight_decay * theta)
            rec = {"iteration": it, "seconds": time.perf_counter() - t0,
                   "mean_reward": float(returns.mean()), "max_reward": float(returns.max()),
                   "startup_seconds": startup, "workers_started": pool.stats().started,
                   "tasks_done": pool.stats().done}
            if it == iterations - 1:
                rec["theta"] = theta.tolist()
            history.append(rec)
            if log:
                print(f"iter {it:3d}  {rec['seconds']:7.2f} s  mean reward {rec['mean_reward']:6.1f}"
                      f"  max {rec['max_reward']:6.1f}", flush=True)
    return history


def time_to_reach(history: list[dict], threshold: float) -> float | None:
    """Seconds of training until the mean reward first reached ``threshold`` (None if
    it never did)."""
    for rec in history:
        if rec["mean_reward"] >= threshold:
            return float(rec["seconds"])
    return None


def check_plotting() -> None:
    """Fail before training, not after it, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("es.py --plot needs matplotlib: pip install -r "
                         "examples/requirements.txt") from None


def plot(histories: dict[int, list[dict]], path: Path, threshold: float,
         title: str = "OpenAI-ES with fiber.Pool") -> None:
    """Two panels: mean reward against wall time, each run from its own start (once its
    workers were up); and the time to reach ``threshold`` against the number of workers
    (start-up stacked below the training time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for workers, hist in histories.items():
        startup = hist[0]["startup_seconds"] if hist else 0.0
        left.plot([0.0] + [h["seconds"] for h in hist],
                  [float("nan")] + [h["mean_reward"] for h in hist], marker=".",
                  label=f"{workers} worker{'s' if workers > 1 else ''} "
                        f"(+{startup:.1f} s start-up)")
    left.axhline(threshold, color="grey", linestyle=":", linewidth=1)
    left.set_xlabel("wall time since the run's workers were up, s")
    left.set_ylabel(f"mean population reward ({ENV_ID})")
    left.set_title("reward against wall time")
    left.legend(fontsize=8)
    counts = list(histories)
    positions = range(len(counts))
    reach = [time_to_reach(histories[w], threshold) for w in counts]
    startups = [histories[w][0]["startup_seconds"] if histories[w] else 0.0 for w in counts]
    right.bar(positions, startups, color="lightgrey", label="workers' start-up")
    right.bar(positions, [r or 0.0 for r in reach], bottom=startups, color="tab:blue",
              label="training")
    for x, r, s0 in zip(positions, reach, startups, strict=True):
        right.text(x, s0 + (r or 0.0), "not reached" if r is None else f"{s0 + r:.1f} s",
                   ha="center", va="bottom", fontsize=8)
    right.set_xticks(list(positions), [str(w) for w in counts])
    right.set_xlabel("workers")
    right.set_ylabel("seconds")
    right.set_title(f"time to a mean reward of {threshold:g}")
    right.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(worker_counts: list[int], path: Path, threshold: float, title: str,
            **kw: object) -> dict[int, list[dict]]:
    """Train once per worker count (same seed, so the same rewards) and plot them."""
    check_plotting()
    histories = {}
    for w in worker_counts:
        print(f"--- {w} workers", flush=True)
        histories[w] = train(w, **kw)  # type: ignore[arg-type]
    plot(histories, path, threshold, title)
    print(f"wrote {path}")
    return histories


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=5)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--population", type=int, default=48, help="even: antithetic pairs")
    p.add_argument("--sigma", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--max-steps", type=int, default=500)
    p.add_argument("--hidden", type=int, default=0, help="hidden units (0: linear policy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adapt", type=float, metavar="SECONDS",
                   help="an adaptive pool (0 to --workers workers) that gives back "
                        "workers idle this long")
    p.add_argument("--json", type=Path, help="write the per-iteration history here")
    p.add_argument("--journal", help="journal the population's results in this file: "
                   "a crashed run, run again with the same journal, resumes (docs/durable.md)")
    p.add_argument("--plot", action="store_true",
                   help="train with 1, 2 and 5 workers (--plot-workers) and plot reward "
                   "against wall time and the time to reach --threshold")
    p.add_argument("--plot-workers", default="1,2,5", help="worker counts for --plot")
    p.add_argument("--threshold", type=float, default=100.0,
                   help="mean reward whose time to reach --plot shows")
    p.add_argument("--plot-out", type=Path,
                   default=Path(__file__).resolve().parent.parent / "bench" / "results" / "es.png")
    args = p.parse_args(argv)
    kw = {"iterations": args.iterations, "population": args.population, "sigma": args.sigma,
          "lr": args.lr, "max_steps": args.max_steps, "hidden": args.hidden, "seed": args.seed}
    try:
        if args.plot:
            counts = [int(w) for w in args.plot_workers.split(",")]
            backend = mp.get_config_value("backend")
            histories = compare(counts, args.plot_out, args.threshold,
                                f"OpenAI-ES with fiber.Pool ({backend} backend)", **kw)
            result: object = {str(w): h for w, h in histories.items()}
        else:
            result = train(args.workers, adapt=args.adapt, journal=args.journal, **kw)
    except ValueError as exc:
        p.error(str(exc))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
