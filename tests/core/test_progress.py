"""The ``progress`` setting: a bar on a terminal for a map that runs longer than 2 s,
nothing when it is off. The program runs in a subprocess whose stderr is a real
pseudo-terminal (``pty.openpty``), as a user's terminal would be."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
import threading

import pytest

PROGRAM = textwrap.dedent("""
    import sys, time
    import fiber

    def nap(x):
        time.sleep(0.15)
        return x

    if __name__ == "__main__":
        with fiber.Pool(2) as pool:
            assert pool.map(nap, range(4)) == list(range(4))  # short: no bar
            # 40 x 0.15 s on 2 workers: 3 s, a second past the bar's delay (at 30 tasks
            # the 0.25 s left was less than a loaded machine delays the bar's thread)
            assert list(pool.imap(nap, range(40))) == list(range(40))
        print("done", flush=True)
""")


def run_on_a_terminal(tmp_path, program=PROGRAM, **env_extra):
    """Run the program with stderr on a pty; returns (stdout, what the pty showed)."""
    script = tmp_path / "prog.py"
    script.write_text(program)
    env = dict(os.environ, TERM="xterm", COLUMNS="100", **env_extra)
    if "FIBER_PROGRESS" not in env_extra:
        env.pop("FIBER_PROGRESS", None)
    master, slave = pty.openpty()
    shown = bytearray()

    def read():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                return
            if not data:
                return
            shown.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        out = subprocess.run([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                             stderr=slave, stdin=subprocess.DEVNULL, text=True, timeout=120)
    finally:
        os.close(slave)
    reader.join(10)
    os.close(master)
    assert out.returncode == 0
    return out.stdout, shown.decode(errors="replace")


def test_a_long_map_shows_a_bar_on_a_terminal(tmp_path):
    stdout, shown = run_on_a_terminal(tmp_path, FIBER_PROGRESS="true")
    assert stdout == "done\n"
    assert "fiber imap" in shown and "40/40" in shown  # labelled by the call
    assert "/4 " not in shown  # the short map (0.3 s) had none


def test_nothing_is_shown_when_off(tmp_path):
    stdout, shown = run_on_a_terminal(tmp_path)
    assert stdout == "done\n" and shown == ""


def test_nothing_is_shown_without_a_terminal(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=dict(os.environ, FIBER_PROGRESS="true"), timeout=120)
    assert out.returncode == 0 and out.stdout == "done\n" and out.stderr == ""


def test_the_setting_without_rich_or_tqdm_says_what_to_install(monkeypatch):
    """rich and tqdm are hidden (``sys.modules[name] = None``, as if not installed)."""
    import fiber
    from fiber.errors import ConfigError

    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    fiber.init(progress=True)
    try:
        with pytest.raises(ConfigError, match=r"pip install './fiber_core\[top\]'"):
            fiber.Pool(1)
    finally:
        fiber.reset()


TIMED = textwrap.dedent("""
    import time
    import fiber

    def nap(x, y=0):
        time.sleep(0.25)
        return x

    if __name__ == "__main__":
        with fiber.Pool(2) as pool:
            pool.map(abs, range(2))  # the workers are up
            start = time.monotonic()
            assert pool.map(nap, range(24), chunksize=1) == list(range(24))
            took = time.monotonic() - start
            assert pool.starmap(nap, [(i, i) for i in range(20)], chunksize=1) \\
                == list(range(20))
        print(f"{took:.3f}", flush=True)
""")


def test_the_bar_is_labelled_by_the_call_and_timed_from_it(tmp_path):
    """A map of 3 s: its bar (shown from 2 s on) is labelled "fiber map" and its clock,
    when it closes, shows the map's whole time, not the time since the bar appeared;
    a starmap's bar says "fiber starmap"."""
    import re

    stdout, shown = run_on_a_terminal(tmp_path, TIMED, FIBER_PROGRESS="true")
    took = float(stdout)
    assert took > 2.5
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    assert "fiber map " in text and "fiber starmap " in text
    # the last frame of the map's bar: "fiber map ... 24/24 H:MM:SS ..."
    (last,) = re.findall(r"fiber map [^\n]*?24/24 (\d+):(\d\d):(\d\d)", text)[-1:]
    shown_seconds = int(last[0]) * 3600 + int(last[1]) * 60 + int(last[2])
    assert took - 1.2 <= shown_seconds <= took + 1, (took, last)
