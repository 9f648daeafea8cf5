"""The stranger test on a cluster backend: a program on the ssh backend (its Pool's
workers and its Manager's server are jobs on the SSH test hosts) is probed by a stranger
on another host, without the run's secret.

The sockets are found from the operating system: the listening sockets of the program
and of every process in the test hosts' network namespaces (sshd aside), from /proc.
Each is probed from a host other than its owner's (a TCP socket) or from inside its
owner's host (an abstract Unix socket, which only that host can reach), by
tests/stranger_probe.py run with ``ip netns exec``: huge length prefixes in every
framing, garbage, rogue pickles, 128 MiB of data, 500 held connections, a trickle of one
byte a second, and a legitimate client (given the secret) that must still get in. The
owners' memory and threads are read meanwhile; the program's rounds must stay correct
and within 1.5x of their undisturbed time. Nothing is faked: real hosts (network
namespaces with their own sshd), real jobs, real sockets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ssh_helpers import ROOT, hosts_script

sys.path.insert(0, str(ROOT / "tests"))
import stranger_probe as probe  # noqa: E402

TARGET = ROOT / "tests" / "core" / "stranger_target.py"
PROBE = ROOT / "tests" / "stranger_probe.py"


def _netns_of(pid: int, namespaces: list[str]) -> str | None:
    """The test host whose network namespace ``pid`` is in (None: this machine's)."""
    try:
        inode = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None
    for ns in namespaces:
        if os.stat(f"/run/netns/{ns}").st_ino == inode:
            return ns
    return None


def _stranger_for(kind: str, home: str | None, namespaces: list[str]) -> str | None:
    """Where the stranger probing a socket of host ``home`` stands: another host for a
    TCP socket, the same host for an abstract Unix socket (only it can reach one)."""
    if kind == "unix":
        return home
    return next(ns for ns in namespaces if ns != home)


def _run_probe(ns: str | None, *args: str, timeout: float = 120) -> object:
    argv = [sys.executable, str(PROBE), *args]
    if ns is not None:
        argv = ["ip", "netns", "exec", ns, *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_stranger_on_another_host_cannot_hurt_the_run(ssh_hosts, tmp_path):
    namespaces = ssh_hosts["namespaces"]
    env = dict(os.environ, FIBER_BACKEND="ssh", PYTHONPATH=str(ROOT / "tests"))
    proc = subprocess.Popen([sys.executable, str(TARGET), str(tmp_path)], env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        ready = tmp_path / "ready.json"
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert proc.poll() is None, "the target program ended before it was ready"
            assert time.monotonic() < deadline, "the target program did not get ready"
            time.sleep(0.2)
        info = json.loads(ready.read_text())
        key_hex = info["key"]
        listener = json.dumps(info["listener"])
        windows = probe.Windows()  # quiet spans (undisturbed rounds) between the probes
        windows.quiet(3)

        sshds = set(ssh_hosts["sshd_pids"])
        on_hosts = {pid for pid in hosts_script.pids_in_namespaces(namespaces)
                    if pid not in sshds and Path(f"/proc/{pid}/comm").exists()
                    and Path(f"/proc/{pid}/comm").read_text().strip() != "sshd"}
        sockets = probe.listening_sockets(probe.family_tree(proc.pid) | on_hosts)
        owners_ns = {address: _netns_of(owner, namespaces) for _, address, owner in sockets}
        # the program's hub and stream listener, the Listener, and the manager's server
        # in a job on a test host, at least
        assert any(ns is not None for ns in owners_ns.values()), sockets
        assert len(sockets) >= 4, sockets

        report = {}
        for kind, address, owner in sockets:
            windows.quiet(2)
            home = owners_ns[address]
            stranger = _stranger_for(kind, home, namespaces)
            where = json.dumps(address)
            name = f"{kind} {address!r} (pid {owner}, host {home or 'this machine'}), " \
                   f"probed from {stranger or 'this machine'}"
            with windows.probing():
                base_rss, base_threads = probe.rss(owner), probe.threads_of(owner)
                kept = _run_probe(stranger, "rude", kind, where, str(tmp_path / "pwned"))
                assert kept == [], (name, kept)
                with ThreadPoolExecutor(1) as one:
                    flooding = one.submit(_run_probe, stranger, "flood", kind, where)
                    peak = base_rss
                    while not flooding.done():
                        peak = max(peak, probe.rss(owner))
                        time.sleep(0.02)
                    flooding.result()
                with ThreadPoolExecutor(1) as one:
                    holding = one.submit(_run_probe, stranger, "hold", kind, where, key_hex,
                                         listener)
                    time.sleep(2.0)
                    threads = probe.threads_of(owner) - base_threads
                    held_rss = probe.rss(owner) - base_rss
                    held = holding.result()
            report[name] = {"flood_rss_growth_mib": (peak - base_rss) / probe.MIB,
                            "held_rss_growth_mib": held_rss / probe.MIB,
                            "threads_with_500_held": threads, "held": held}
            assert held["held"] == probe.HOLD and held["legitimate"], (name, held)
            assert (peak - base_rss) / probe.MIB < 16, (name, report[name])
            assert held_rss / probe.MIB < 16, (name, report[name])
            assert threads < 5, (name, report[name])

        windows.quiet(2)
        with windows.probing(), ThreadPoolExecutor(len(sockets)) as pool:
            trickles = list(pool.map(
                lambda s: _run_probe(_stranger_for(s[0], owners_ns[s[1]], namespaces),
                                     "trickle", s[0], json.dumps(s[1])), sockets))
        assert max(trickles) < probe.DEADLINE + 4, trickles
        windows.quiet(3)

        assert not (tmp_path / "pwned").exists()
        quiet = windows.rounds(tmp_path / "rounds.txt", "quiet")
        probed = windows.rounds(tmp_path / "rounds.txt", "probed")
        assert len(quiet) >= 5 and len(probed) >= 5
        ratio = probe.median(probed) / probe.median(quiet)
        (tmp_path / "stop").touch()
        assert proc.wait(120) == 0
        assert (tmp_path / "done").exists()
        print(json.dumps({"figures": report, "trickle_s": trickles, "round_ratio": ratio},
                         indent=1, default=str))
        assert ratio < 1.5, (ratio, probe.median(probed), probe.median(quiet))
    finally:
        (tmp_path / "stop").touch()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
