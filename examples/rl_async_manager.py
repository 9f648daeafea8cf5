"""Remote RL environments with fiber's AsyncManager, timed against a serial loop.

Each environment object lives in a fiber job (a process on the selected backend); the
learner holds proxies whose methods return *handles* at once, so the step of every
environment runs at the same time and the learner collects the results with
``.get()``::

    class EnvManager(AsyncManager): pass
    EnvManager.register("Env", SlowCartPole)
    manager = EnvManager(); manager.start()
    envs = [manager.Env(seed) for seed in range(10)]
    handles = [env.step(a) for env, a in zip(envs, actions)]
    results = [h.get() for h in handles]

The environments are CartPole-v1 made artificially expensive (``--step-ms`` of CPU-free
waiting per step, standing in for a real simulator), so the parallel speed-up is visible
even on a small machine. The same random actions go to both loops, so both must see
exactly the same observations and rewards (the script checks it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from fiber.managers import AsyncManager


class SlowCartPole:
    """CartPole-v1 whose every reset/step also waits ``step_ms`` milliseconds."""

    def __init__(self, seed: int, step_ms: float = 5.0) -> None:
        import gymnasium as gym

        self.env = gym.make("CartPole-v1")
        self.seed = seed
        self.delay = step_ms / 1000

    def reset(self) -> list[float]:
        time.sleep(self.delay)
        obs, _ = self.env.reset(seed=self.seed)
        return obs.tolist()

    def step(self, action: int) -> tuple[list[float], float, bool]:
        time.sleep(self.delay)
        obs, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            obs, _ = self.env.reset()
        return obs.tolist(), float(reward), bool(terminated or truncated)


class EnvManager(AsyncManager):
    """A manager whose registered class lives in remote fiber jobs."""


EnvManager.register("SlowCartPole", SlowCartPole)


def actions_for(n_envs: int, steps: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, size=(steps, n_envs))


def run_remote(n_envs: int, steps: int, step_ms: float, seed: int) -> tuple[float, list]:
    """The learner loop over remote environments; returns (seconds, transitions)."""
    manager = EnvManager()
    manager.start()
    try:
        envs = [manager.SlowCartPole(seed + i, step_ms) for i in range(n_envs)]
        actions = actions_for(n_envs, steps, seed)
        t0 = time.perf_counter()
        handles = [env.reset() for env in envs]
        trace = [[h.get() for h in handles]]
        for t in range(steps):
            handles = [env.step(int(a)) for env, a in zip(envs, actions[t], strict=True)]
            trace.append([h.get() for h in handles])
        return time.perf_counter() - t0, trace
    finally:
        manager.shutdown()


def run_serial(n_envs: int, steps: int, step_ms: float, seed: int) -> tuple[float, list]:
    """The same loop with the environments in this process, one after the other."""
    envs = [SlowCartPole(seed + i, step_ms) for i in range(n_envs)]
    actions = actions_for(n_envs, steps, seed)
    t0 = time.perf_counter()
    trace = [[env.reset() for env in envs]]
    for t in range(steps):
        trace.append([env.step(int(a)) for env, a in zip(envs, actions[t], strict=True)])
    return time.perf_counter() - t0, trace


def _plain(trace: list) -> list:
    return json.loads(json.dumps(trace))  # tuples and lists compare alike


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=10)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write timings here")
    args = p.parse_args(argv)
    if args.envs < 1 or args.steps < 1 or args.step_ms < 0:
        p.error("--envs and --steps must be >= 1 and --step-ms >= 0")
    serial_s, serial_trace = run_serial(args.envs, args.steps, args.step_ms, args.seed)
    remote_s, remote_trace = run_remote(args.envs, args.steps, args.step_ms, args.seed)
    same = _plain(serial_trace) == _plain(remote_trace)
    result = {"envs": args.envs, "steps": args.steps, "step_ms": args.step_ms,
              "serial_seconds": serial_s, "remote_seconds": remote_s,
              "speedup": serial_s / remote_s, "same_transitions": same}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
