"""A stranger probes a running fiber program on every socket it and its jobs listen on.

The program (tests/core/stranger_target.py: a Pool, a Manager, a shared Lock and Value,
a Listener) works in rounds while the test, holding no secret, sends what a port
scanner or a hostile user of the machine could: huge length prefixes in every framing
fiber speaks, garbage, rogue pickles, 128 MiB of unauthenticated data, 500 held
connections, a one-byte-a-second trickle and a replayed handshake, then the held
connections again under a limit on the program's threads (a pids cgroup). The sockets
are found from the operating system (/proc), not from fiber's bookkeeping; the only
thing read from the program is its secret, to check that legitimate clients still get
in. Nothing is faked: real sockets against the real program on the local backend.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import stranger_probe as probe  # noqa: E402

HERE = Path(__file__).parent
MIB = probe.MIB


@pytest.fixture
def program(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    env = dict(os.environ, FIBER_BACKEND="local")
    proc = subprocess.Popen([sys.executable, str(HERE / "stranger_target.py"),
                             str(tmp_path)], env=env, start_new_session=True)
    cgroup = probe.PidsLimit()
    try:
        ready = tmp_path / "ready.json"
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, "the target program ended before it was ready"
            assert time.monotonic() < deadline, "the target program did not get ready"
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        yield proc, info, tmp_path, cgroup
    finally:
        cgroup.lift()
        (tmp_path / "stop").touch()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        cgroup.remove()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_stranger_cannot_hurt_a_running_program(program):
    proc, info, out, cgroup = program
    key = bytes.fromhex(info["key"])
    marker = out / "pwned"
    rounds_file = out / "rounds.txt"
    windows = probe.Windows()  # quiet spans (undisturbed rounds) between the probes
    windows.quiet(3)
    sockets = probe.listening_sockets(probe.family_tree(proc.pid))
    kinds = {kind for kind, _, _ in sockets}
    # the hub (nng), its stream listener (TCP and abstract Unix), the manager's server
    # (in its job) and the Listener at least
    assert kinds == {"tcp", "unix"} and len(sockets) >= 5, sockets
    report: dict[str, dict[str, float]] = {}

    for kind, address, owner in sockets:
        windows.quiet(2)
        name = f"{kind} {address!r} (pid {owner})"
        base_rss, base_threads = probe.rss(owner), probe.threads_of(owner)
        figures = report.setdefault(name, {})
        with windows.probing():
            # huge length prefixes in every framing, garbage, rogue pickles: all closed
            assert probe.rude(kind, address, str(marker)) == [], name
            # 128 MiB of unauthenticated data, with the owner's memory watched meanwhile
            peak = base_rss
            flooding = threading.Thread(target=probe.flood, args=(kind, address, 128 * MIB))
            flooding.start()
            while flooding.is_alive():
                peak = max(peak, probe.rss(owner))
                flooding.join(0.02)
            figures["flood_rss_growth_mib"] = (peak - base_rss) / MIB
            # 500 held connections: no thread each, and a legitimate client still gets in
            with ThreadPoolExecutor(1) as one:
                holding = one.submit(probe.hold, kind, address, 2.0, key, info["listener"])
                time.sleep(1.5)
                figures["threads_with_500_held"] = probe.threads_of(owner) - base_threads
                figures["held_rss_growth_mib"] = (probe.rss(owner) - base_rss) / MIB
                held = holding.result(60)
        assert held["held"] == probe.HOLD and held["legitimate"], (name, held)
        assert figures["flood_rss_growth_mib"] < 16, (name, figures)
        assert figures["held_rss_growth_mib"] < 16, (name, figures)
        assert figures["threads_with_500_held"] < 5, (name, figures)

    # a trickle of one byte a second on every socket at once: closed at the deadline
    windows.quiet(2)
    with windows.probing(), ThreadPoolExecutor(len(sockets)) as pool:
        trickles = list(pool.map(lambda s: probe.trickle(s[0], s[1]), sockets))
    assert max(trickles) < probe.DEADLINE + 4, trickles

    # a replayed proof of the secret opens no stream connection
    for kind, address, _ in sockets:
        if kind == "unix":
            assert probe.replay(kind, address, key), "a replayed proof was not refused"

    # the held connections again, under a limit on the program's threads
    if cgroup.available():
        cgroup.limit(probe.family_tree(proc.pid), headroom=40)
        try:
            for kind, address, _ in sockets:
                outcome = probe.hold(kind, address, 0.5, key, info["listener"])
                assert outcome["legitimate"], (kind, address, outcome)
            time.sleep(1)
            assert proc.poll() is None
        finally:
            cgroup.lift()
    windows.quiet(3)

    # every socket still lets the run in, nothing ran, the program's work went on
    for kind, address, _ in sockets:
        assert probe.legitimate(kind, address, key, info["listener"])
    assert not marker.exists()
    quiet = windows.rounds(rounds_file, "quiet")
    probed = windows.rounds(rounds_file, "probed")
    assert len(quiet) >= 5 and len(probed) >= 5
    ratio = probe.median(probed) / probe.median(quiet)
    (out / "stop").touch()
    assert proc.wait(60) == 0
    assert (out / "done").exists()
    print(json.dumps({"sockets": len(sockets), "figures": report, "trickle_s": trickles,
                      "round_ratio": ratio}, indent=1, default=str))
    assert ratio < 1.5, (ratio, probe.median(probed), probe.median(quiet))
