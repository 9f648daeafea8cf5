"""``fiber top`` against a real program on the local backend: the program runs in a
subprocess with a Pool busy on a long run of tasks, and ``fiber top --once --json``
runs as a user would run it (``python -m fiber``). Each test points ``TMPDIR`` at its
own directory, so it sees only its own program's registration (not those of other
fiber programs on the machine)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

PROGRAM = textwrap.dedent("""
    import os, sys, time
    import fiber

    def work(x, release):
        if x == 3:
            raise ValueError(f"bad item {x}")
        if x == 7:  # the slow task: runs until the test has seen it (at most 2 minutes)
            deadline = time.monotonic() + 120
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(0.1)
        return x

    if __name__ == "__main__":
        stop = sys.argv[1]
        release = stop + "-slow"
        with fiber.Pool(2) as pool:
            results = [pool.apply_async(work, (i, release)) for i in range(100000)]
            print("ready", flush=True)
            while not os.path.exists(stop):
                time.sleep(0.05)
            pool.terminate()
        print("bye", flush=True)
""")


@pytest.fixture
def program(tmp_path):
    """A running program with a busy Pool of 2; yields (Popen, env, stop file)."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, str(script), str(stop)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc, env, stop
    stop.touch()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def top_json(env, *extra):
    out = subprocess.run([sys.executable, "-m", "fiber", "top", "--once", "--json", *extra],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_for(env, predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        snap = top_json(env)
        if predicate(snap["pools"][0]):
            return snap
        assert time.monotonic() < deadline, snap
        time.sleep(0.2)


def registration(tmp_path):
    directory = tmp_path / f"fiber-status-{os.getuid()}"
    return directory, sorted(directory.glob("*.json"))


def test_top_once_json_shows_states_counts_and_errors(program, tmp_path):
    proc, env, stop = program
    snap = wait_for(env, lambda p: p["workers"]["running"] == 2 and p["errors"]
                    and p["tasks"]["done"] > 10)
    assert snap["program"]["pid"] == proc.pid
    assert snap["program"]["backend"] == "local"
    (pool,) = snap["pools"]
    assert pool["state"] == "RUN" and pool["processes"] == 2
    workers = pool["workers"]
    assert workers["running"] == 2 and workers["busy"] == 2
    assert (workers["pending"], workers["starting"], workers["lost"]) == (0, 0, 0)
    assert len(pool["worker_list"]) == 2
    assert {w["pid"] for w in pool["worker_list"]} == {int(w["job_id"])
                                                       for w in pool["worker_list"]}
    tasks = pool["tasks"]
    assert tasks["queued"] > 1000 and tasks["failed"] == 1 and tasks["running"] >= 2
    # the task that raised, with its remote traceback
    (error,) = pool["errors"]
    assert error["error"] == "ValueError: bad item 3"
    assert "args=(3, " in error["task"]
    assert 'raise ValueError(f"bad item {x}")' in error["traceback"]
    assert error["traceback"].startswith("Traceback (most recent call last):")
    # the slow task (it runs until released: a task of fixed length could end before a
    # loaded machine's `fiber top` saw it, issue #44) is the slowest one running
    assert pool["slowest"] and all(s["seconds"] >= 0 for s in pool["slowest"])
    slow = wait_for(env, lambda p: p["slowest"][0]["seconds"] > 1)["pools"][0]["slowest"]
    assert "args=(7," in slow[0]["task"]
    (tmp_path / "stop-slow").touch()
    # done grows between two calls, and throughput is measured
    later = wait_for(env, lambda p: p["tasks"]["done"] > tasks["done"])["pools"][0]
    assert later["tasks"]["done"] > tasks["done"] and later["throughput"] > 0
    # the registration is private to the user
    directory, files = registration(tmp_path)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert top_json(env, "--pid", str(proc.pid))["program"]["pid"] == proc.pid


def test_top_view_and_list(program):
    proc, env, stop = program
    wait_for(env, lambda p: p["workers"]["running"] == 2 and p["errors"])
    out = subprocess.run([sys.executable, "-m", "fiber", "top", "--once"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"pid {proc.pid}" in out.stdout and "Pool 1 (RUN)" in out.stdout
    assert "ValueError: bad item 3" in out.stdout
    out = subprocess.run([sys.executable, "-m", "fiber", "top", "--list"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(f"{proc.pid}  run=")
    out = subprocess.run([sys.executable, "-m", "fiber", "top", "--once", "--pid", "1"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no running fiber program with pid 1" in out.stderr


def test_a_client_without_the_secret_is_refused(program, monkeypatch, tmp_path):
    """The status channel answers only connections that hold the run's secret: a
    client with another secret fails the hub's handshake, and a raw nng connection
    that sends the status request without one gets an error, not the snapshot."""
    import pynng

    from fiber.errors import AuthenticationError, ConnectionLostError
    from fiber.runtime import status
    from fiber.wire.protocol import CHANNEL, MSG, OK, StatusOp

    proc, env, stop = program
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    (prog,) = list(status.programs())
    assert prog.pid == proc.pid
    assert status.query(prog)["program"]["pid"] == proc.pid  # with the secret: answered
    with pytest.raises((AuthenticationError, ConnectionLostError)):
        status.query(prog, authkey=os.urandom(32))
    with pynng.Req0(recv_timeout=10_000) as sock:
        sock.dial(prog.address, block=True)
        sock.send(MSG + CHANNEL.pack(prog.channel) + StatusOp.SNAPSHOT)
        reply = sock.recv()
    assert reply[:1] != OK and b"pools" not in reply


def test_registration_removed_at_exit_and_stale_ones_ignored(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    script = tmp_path / "short.py"
    script.write_text(textwrap.dedent("""
        import fiber
        if __name__ == "__main__":
            with fiber.Pool(1) as pool:
                assert pool.apply(abs, (-1,)) == 1
                import glob, os, tempfile
                print(len(glob.glob(os.path.join(tempfile.gettempdir(),
                                                 f"fiber-status-{os.getuid()}", "*.json"))))
    """))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"  # registered while it ran
    directory, files = registration(tmp_path)
    assert files == []  # removed at its exit
    # a registration whose process is gone (killed before it could remove it)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = directory / f"{dead.pid}-1.json"
    stale.write_text(json.dumps({"pid": dead.pid, "started": 1, "address": "tcp://127.0.0.1:9",
                                 "channel": 1, "authkey": "00" * 32, "run": "x",
                                 "argv": ["gone.py"], "since": time.time()}))
    stale.chmod(0o600)
    out = subprocess.run([sys.executable, "-m", "fiber", "top", "--once", "--json"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no running fiber program" in out.stderr
    assert not stale.exists()  # swept


def test_without_rich_the_view_says_what_to_install():
    """rich is hidden from the command (``sys.modules['rich'] = None`` makes its import
    fail, as if it were not installed); the JSON output does not need it."""
    code = ("import sys; sys.modules['rich'] = None; from fiber.cli import main; "
            "sys.exit(main(['top', '--once']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert "pip install './fiber_core[top]'" in out.stderr
    assert "pip install 'fiber-core[top]'" in out.stderr


def _nap_until(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "released"


def _raise(x):
    raise KeyError(x)


def test_pool_stats_has_what_top_shows(tmp_path):
    """In-process: Pool.stats() records the last errors with their remote tracebacks,
    the slowest task in progress and the throughput."""
    import fiber
    from fiber.pool import RunningTask, TaskError

    with fiber.Pool(2) as pool:
        assert pool.map(abs, range(-50, 50), chunksize=1) == [abs(x) for x in range(-50, 50)]
        with pytest.raises(KeyError):
            pool.apply(_raise, ("k",))
        # (the task runs until released, so that it is still running when seen)
        release = tmp_path / "release"
        slow = pool.apply_async(_nap_until, (str(release),))
        deadline = time.monotonic() + 30
        while True:
            stats = pool.stats()
            if stats.slowest and stats.slowest[0].seconds > 0.5:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
        (running,) = stats.slowest
        assert isinstance(running, RunningTask) and str(release) in running.task
        assert stats.throughput > 0 and stats.pending == 0
        (error,) = stats.errors
        assert isinstance(error, TaskError) and error.error == "KeyError: 'k'"
        assert "in _raise" in error.traceback and "args=('k',)" in error.task
        release.touch()
        assert slow.get(30) == "released"


# -- the live view in a real terminal (a pty) ------------------------------------------

TERMINAL_PROGRAM = textwrap.dedent("""
    import os, sys, time
    import fiber

    def work(x):
        time.sleep(0.5)
        return x

    if __name__ == "__main__":
        with fiber.Pool(4) as pool:
            it = pool.imap(work, range(int(sys.argv[1])))
            print("ready", flush=True)
            for _ in it:
                pass
        print("bye", flush=True)
""")

ANSI = __import__("re").compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _default_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """``fiber top`` on a pseudo-terminal (its stdin, stdout and stderr), as a user
    runs it; everything it writes is collected by a thread."""

    def __init__(self, env, *args):
        import pty
        import termios
        import threading

        self.master, self.slave = pty.openpty()
        self.before = termios.tcgetattr(self.slave)
        env = dict(env, COLUMNS="120", LINES="50", TERM="xterm-256color")
        # SIGINT as a terminal's shell leaves it to a command it runs: a test run in the
        # background of a script without job control inherits it ignored (CI's lanes),
        # and Python then installs no KeyboardInterrupt for it
        self.proc = subprocess.Popen([sys.executable, "-m", "fiber", "top", *args],
                                     stdin=self.slave, stdout=self.slave,
                                     stderr=self.slave, env=env,
                                     preexec_fn=_default_sigint)
        self.out = b""
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the slave side is closed
                return
            if not data:
                return
            with self.lock:
                self.out += data

    def text(self):
        with self.lock:
            return self.out.decode("utf-8", "replace")

    def type(self, keys):
        os.write(self.master, keys)

    def attributes(self):
        import termios

        return termios.tcgetattr(self.slave)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.slave)
        os.close(self.master)
        self.reader.join(5)


def tasks_running(text):
    """The tasks' "running" counts of every frame drawn so far: the value under the
    ``running`` header of the tasks' row (right-aligned, so it ends where the header
    ends)."""
    lines = [ANSI.sub("", line) for line in text.replace("\r", "").split("\n")]
    found = []
    for i, line in enumerate(lines[:-1]):
        header = line.lstrip("│ ")
        if not header.startswith("tasks "):
            continue
        end = line.index(" running") + len(" running")
        value = lines[i + 1][:end].split()
        if value and value[-1].isdigit():
            found.append(int(value[-1]))
    return found


@pytest.fixture
def terminal_program(tmp_path):
    procs = []

    def start(items):
        env = dict(os.environ, TMPDIR=str(tmp_path))
        script = tmp_path / "busy.py"
        script.write_text(TERMINAL_PROGRAM)
        proc = subprocess.Popen([sys.executable, str(script), str(items)], env=env,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc, env

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_top_in_a_terminal_quits_on_q_without_echo_and_counts_running_tasks(
        terminal_program):
    """4 workers running 0.5 s tasks of an imap (which hands each worker batches of
    several): "running" is at most 4 in every frame; the help says how to leave; typed
    keys are not echoed into the view; q quits with status 0 within a second, and the
    terminal's settings are as they were; Ctrl-C too."""
    proc, env = terminal_program(100000)
    term = Terminal(env, "--interval", "0.3")
    try:
        _until(lambda: len(tasks_running(term.text())) >= 6, 60, term.text()[-3000:])
        assert "q: quit" in term.text()
        term.type(b"xkxkx")
        time.sleep(1.0)
        assert "xkxkx" not in term.text()
        assert term.proc.poll() is None  # other keys do not quit
        running = tasks_running(term.text())
        assert running and max(running) <= 4 and max(running) >= 1, running
        typed = time.monotonic()
        term.type(b"q")
        assert term.proc.wait(5) == 0
        # The bound is the behaviour (a key is read at once, not at the next refresh),
        # so it stays; it failed once (1.5 s) under scripts/load with the machine's load
        # average at 11-33 on 2 cores, where the interpreter's exit alone can take that.
        assert time.monotonic() - typed < 1.0
        assert term.attributes() == term.before  # cbreak/no echo undone
    finally:
        term.close()
    # Ctrl-C (SIGINT, as the terminal sends it) also leaves with status 0 and the
    # terminal's settings restored; while the view runs they are cbreak, no echo
    import signal
    import termios

    term = Terminal(env, "--interval", "0.3")
    try:
        _until(lambda: len(tasks_running(term.text())) >= 2, 60, term.text()[-3000:])
        lflag = term.attributes()[3]
        assert not lflag & termios.ECHO and not lflag & termios.ICANON
        term.proc.send_signal(signal.SIGINT)
        assert term.proc.wait(5) == 0
        assert term.attributes() == term.before
    finally:
        term.close()


def test_top_in_a_terminal_ends_with_the_program(terminal_program):
    """When the program ends, the view is erased (not left stale), a line says the
    program ended, and fiber top exits with status 0 within seconds."""
    proc, env = terminal_program(24)  # about 3 s of work on 4 workers
    term = Terminal(env, "--interval", "0.3")
    try:
        assert proc.wait(60) == 0
        ended = time.monotonic()
        assert term.proc.wait(10) == 0
        assert time.monotonic() - ended < 5
        _until(lambda: "has ended" in term.text(), 5, term.text()[-2000:])
        text = term.text()
        assert f"fiber top: program {proc.pid} has ended" in ANSI.sub("", text)
        last_frame = text[text.rindex("fiber top  pid"):]
        frame, _, after = last_frame.rpartition("q: quit")
        # every line of the last frame is erased (cursor up, erase line) before the
        # closing line
        assert after.count("\x1b[2K") >= frame.count("\n") > 5, after
        assert term.attributes() == term.before
    finally:
        term.close()
