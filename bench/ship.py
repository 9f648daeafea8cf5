"""Shipping a program to hosts with only a Python (issue #38): what it costs.

``python bench/ship.py [--out bench/results/ship] [--repeat 3] [--jobs 100]`` starts
SSH test hosts on this machine (scripts/engines/ssh/hosts.py: 4 *bare* hosts, whose
sshd sees none of the developer's environment and has a /tmp of its own, and 1
ordinary host, which sees this checkout and its environment at the same paths), and
measures, for a small program (a module next to its main script):

- the megabytes shipped: the code and packages archives (compressed, as sent) and
  their files (unpacked);
- the seconds from ``Pool(1)`` to its first result on one host: *fresh* (a bare host
  whose cache was emptied: the first job fetches and unpacks everything, and its
  imports compile), *warm* (the same host again: the cache serves it), and
  *preinstalled* (the ordinary host, ``ship=off``: the job runs this environment's
  Python from the same paths, as before issue #38);
- ``--jobs`` workers spread over the 4 bare hosts, with their caches emptied: how many
  times each archive was sent (once per host, not once per job).

Writes ``ship.json`` and ``RESULTS.md`` in ``--out``. Needs root (network namespaces)
and fiber-ssh installed. The hosts are torn down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOSTS_SCRIPT = REPO / "scripts" / "engines" / "ssh" / "hosts.py"

PROGRAM = '''
import json, os, sys, time
t0 = time.monotonic()
import fiber
from fiber.runtime.ship import serving
from mylib import step

if __name__ == "__main__":
    n = int(os.environ["BENCH_WORKERS"])
    with fiber.Pool(n) as pool:
        first = pool.apply(step, (1,))
        t_first = time.monotonic() - t0
        if n > 1:  # every worker up, so that every host has fetched
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                stats = pool.stats()
                if stats.idle + stats.busy == n or stats.lost:
                    break
                time.sleep(0.1)
            up = pool.stats()
            ok = pool.map(step, range(4 * n)) == [x + 1 for x in range(4 * n)]
        else:
            up, ok = None, True
    print(json.dumps({"first": t_first, "ok": ok and first == 2,
                      "workers_up": None if up is None else up.idle + up.busy,
                      "sent": serving.sent()}))
'''


def _up(base: str, count: int, hide: list[str]) -> dict:
    argv = [sys.executable, str(HOSTS_SCRIPT), "up", "--dir", base, "--count", str(count),
            "--owner", str(os.getpid())]
    for place in hide:
        argv += ["--hide", place]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"cannot start the ssh test hosts: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _down(base: str) -> None:
    subprocess.run([sys.executable, str(HOSTS_SCRIPT), "down", "--dir", base], check=False,
                   stdin=subprocess.DEVNULL)


def _ssh(state: dict, host: dict, command: str) -> None:
    subprocess.run(["ssh", "-i", state["key_file"], "-o",
                    f"UserKnownHostsFile={state['known_hosts']}", "-o", "BatchMode=yes",
                    "-p", str(host["port"]), f"root@{host['address']}", command],
                   check=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def _empty_caches(state: dict) -> None:
    for host in state["hosts"]:
        _ssh(state, host, f"rm -rf /tmp/fiber-ship-{os.getuid()}")


def _run(project: Path, state: dict, hosts: list[dict], workers: int, slots: int,
         ship: str) -> dict:
    env = {**os.environ, "FIBER_BACKEND": "ssh",
           "FIBER_SSH_HOSTS": ",".join(f"root@{h['address']}:{h['port']}*{slots}"
                                       for h in hosts),
           "FIBER_SSH_KEY_FILE": state["key_file"],
           "FIBER_SSH_KNOWN_HOSTS": state["known_hosts"],
           "FIBER_SHIP": ship, "BENCH_WORKERS": str(workers)}
    done = subprocess.run([sys.executable, "main.py"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"the program failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["ok"]:
        raise SystemExit(f"wrong results: {out}")
    return out


def _archives(project: Path) -> dict:
    """The sizes of what the program ships (from this process: the same plan)."""
    code = textwrap.dedent('''
        import json, os
        from fiber.runtime import config
        from fiber.runtime.ship import plan
        import __main__
        __main__.__file__ = os.path.abspath("main.py")

        class Backend:  # (the plan reads only the name, for the plugin to ship)
            name = "ssh"

        cfg = config.load({"ship": ["on"], "backend": "ssh"})
        s = plan.shipment(cfg, Backend())
        print(json.dumps({a.kind: {"bytes": a.size, "unpacked": a.unpacked,
                                   "files": a.files} for a in s.archives}))
    ''')
    env = {**os.environ, "FIBER_SSH_HOSTS": "root@127.0.0.1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=project, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ship")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--jobs", type=int, default=100)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    hide = sorted({str(REPO), sys.prefix, os.path.realpath(sys.base_prefix),
                   "/var/cache/fiber", os.path.expanduser("~/.pyenv"),
                   os.path.expanduser("~/.cache"), os.path.expanduser("~/.local")} - {"/usr"})
    hide = [h for h in hide if os.path.isdir(h)]
    project = Path(tempfile.mkdtemp(prefix="fiber-bench-ship-"))
    (project / "main.py").write_text(PROGRAM)
    (project / "mylib.py").write_text("def step(x):\n    return x + 1\n")
    bare_dir = tempfile.mkdtemp(prefix="fiber-bench-bare-")
    plain_dir = tempfile.mkdtemp(prefix="fiber-bench-plain-")
    result: dict = {"archives": _archives(project)}
    try:
        bare = _up(bare_dir, 4, hide)
        plain = _up(plain_dir, 1, [])
        one = bare["hosts"][:1]
        fresh, warm, pre = [], [], []
        for _ in range(args.repeat):
            _empty_caches(bare)
            fresh.append(_run(project, bare, one, 1, 4, "on")["first"])
            warm.append(_run(project, bare, one, 1, 4, "on")["first"])
            pre.append(_run(project, plain, plain["hosts"], 1, 4, "off")["first"])
        result["first_result_seconds"] = {"fresh": fresh, "warm": warm, "preinstalled": pre}
        _empty_caches(bare)
        slots = -(-args.jobs // len(bare["hosts"]))
        t0 = time.monotonic()
        many = _run(project, bare, bare["hosts"], args.jobs, slots, "on")
        result["many"] = {"jobs": args.jobs, "hosts": len(bare["hosts"]),
                          "workers_up": many["workers_up"],
                          "sent_per_archive": sorted(many["sent"].values()),
                          "seconds": time.monotonic() - t0}
    finally:
        _down(bare_dir)
        _down(plain_dir)
        shutil.rmtree(project, ignore_errors=True)
    (args.out / "ship.json").write_text(json.dumps(result, indent=2))
    med = {k: statistics.median(v) for k, v in result["first_result_seconds"].items()}
    mib = {k: (v["bytes"] / 2**20, v["unpacked"] / 2**20, v["files"])
           for k, v in result["archives"].items()}
    lines = [
        "# Shipping to bare hosts (bench/ship.py)", "",
        f"`python bench/ship.py --repeat {args.repeat} --jobs {args.jobs}` on this machine "
        "(SSH test hosts in network namespaces: 4 bare, 1 with this environment).", "",
        "| archive | sent (MiB) | unpacked (MiB) | files |", "|---|---|---|---|",
        *(f"| {k} | {a:.2f} | {b:.2f} | {n} |" for k, (a, b, n) in mib.items()), "",
        "| first result of `Pool(1)` on one host | median s | runs |", "|---|---|---|",
        *(f"| {k} | {med[k]:.2f} | {', '.join(f'{x:.2f}' for x in v)} |"
          for k, v in result["first_result_seconds"].items()), "",
        f"{args.jobs} workers on {len(bare['hosts'])} bare hosts with empty caches: "
        f"{result['many']['workers_up']} up; each archive sent "
        f"{result['many']['sent_per_archive']} times; "
        f"{result['many']['seconds']:.1f} s for the whole program.", "",
    ]
    (args.out / "RESULTS.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
