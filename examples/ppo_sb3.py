"""stable-baselines3 PPO on CartPole-v1 whose environment processes are fiber jobs.

``SubprocVecEnv`` runs each environment in a ``multiprocessing`` process that it makes
with ``mp.get_context(start_method)``, ``ctx.Pipe()`` and ``ctx.Process(...)``, where
``mp`` is the ``multiprocessing`` module imported by
``stable_baselines3.common.vec_env.subproc_vec_env``. Pointing that one name at fiber
(fiber's ``get_context`` accepts every start method name) turns every environment into
a job on the selected backend -- local processes by default, containers or cluster jobs
with ``FIBER_BACKEND`` -- while PPO itself is untouched::

    stable_baselines3.common.vec_env.subproc_vec_env.mp = fiber   # the one line

Requirements (examples/requirements-rl.txt): ``pip install torch==2.13.0`` (the CPU
wheel) first, then stable-baselines3 and gymnasium.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
import stable_baselines3.common.vec_env.subproc_vec_env as sb3_subproc
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import SubprocVecEnv, VecMonitor

import fiber

sb3_subproc.mp = fiber  # SubprocVecEnv's Process and Pipe are now fiber's


def make_env(seed: int):
    """A picklable environment factory (runs inside the fiber job)."""

    def thunk() -> gym.Env:
        env = gym.make("CartPole-v1")
        env.reset(seed=seed)
        return env

    return thunk


def train(n_envs: int, timesteps: int, seed: int = 0, n_steps: int = 256) -> dict:
    """Train PPO for ``timesteps`` steps; returns what happened (for the test)."""
    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    import torch

    torch.set_num_threads(1)  # leave the cores to the environment processes
    if timesteps < n_envs * n_steps:
        raise ValueError(f"timesteps must be at least n_envs * n_steps = {n_envs * n_steps}")
    env = VecMonitor(SubprocVecEnv([make_env(seed + i) for i in range(n_envs)]))
    try:
        process_types = sorted({type(p).__module__ + "." + type(p).__name__
                                for p in env.venv.processes})
        # SB3 asks for a forkserver context: its Process is a fiber Process (a job)
        job_backed = all(isinstance(p, fiber.Process) for p in env.venv.processes)
        model = PPO("MlpPolicy", env, n_steps=n_steps, batch_size=64, seed=seed, verbose=0,
                    device="cpu")
        # the policy PPO trains is the stochastic one: evaluated as it acts in training.
        # The untrained network's greedy actions are no baseline: with seed 0 they
        # balance the pole for 416 steps by chance, and 20k steps of training do not
        # beat that luck (407), while its sampled actions score about 20
        before, _ = evaluate_policy(model, env, n_eval_episodes=10, deterministic=False)
        t0 = time.perf_counter()
        model.learn(total_timesteps=timesteps)
        seconds = time.perf_counter() - t0
        after, _ = evaluate_policy(model, env, n_eval_episodes=10, deterministic=False)
        return {"process_types": process_types, "job_backed": job_backed,
                "timesteps": int(model.num_timesteps),
                "train_seconds": seconds, "reward_before": float(before),
                "reward_after": float(after)}
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--timesteps", type=int, default=20_000)
    p.add_argument("--n-steps", type=int, default=256, help="rollout length per env")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the summary here")
    args = p.parse_args(argv)
    try:
        result = train(args.envs, args.timesteps, args.seed, args.n_steps)
    except ValueError as exc:
        p.error(str(exc))
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
