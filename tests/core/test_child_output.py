"""Children's output as the parent writes it: whole lines, in the order each child
wrote them, all of it before the parent's lines that follow a join() of that child; an
unfinished line (a prompt) still shows while the child waits."""

from __future__ import annotations

import re
import subprocess
import sys

TALKERS = """
import sys, time, fiber

def talk(n):
    for i in range(n):
        print(f"line {i} of", fiber.current_process().name, "x" * 40)
    sys.stdout.write("unfinished ")
    sys.stdout.flush()  # sent without its newline
    time.sleep(0.2)
    print("finished")

if __name__ == "__main__":
    talkers = [fiber.Process(target=talk, args=(300,), name=f"t{k}") for k in range(3)]
    for p in talkers:
        p.start()
    for p in talkers:
        p.join()
    print("PARENT AFTER JOIN")
"""

LINE = re.compile(r"^(\[t\d\] )?(line \d+ of t\d x{40}|unfinished finished|PARENT AFTER JOIN)$")


def test_lines_are_whole_in_order_and_before_the_parent_after_join(run_script):
    for _ in range(3):
        result = run_script(TALKERS)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[-1] == "PARENT AFTER JOIN"
        assert all(LINE.match(line) for line in lines), [
            line for line in lines if not LINE.match(line)]
        assert lines.count("unfinished finished") == 3
        for k in range(3):  # each child's lines in the order it wrote them
            own = [int(line.split()[1]) for line in lines if line.endswith(f"of t{k} " + "x" * 40)]
            assert own == list(range(300))


def test_prefixed_lines_are_prefixed_once(run_script):
    result = run_script(TALKERS, env={"FIBER_OUTPUT_PREFIX": "true"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("[t1] unfinished finished") == 1
    assert all(LINE.match(line) for line in lines)
    assert sum(line.startswith("[t2] line ") for line in lines) == 300


def test_an_unfinished_line_shows_while_the_child_waits(tmp_path):
    # The child waits, after its unfinished line, until the test has seen that line (a
    # file the test creates; at most 60 s): "done" after it says the line was shown
    # while the child waited, "not seen" that it came only at the child's end. (A fixed
    # 4 s sleep and a 3.5 s bound, start-up included, failed on a loaded machine whose
    # start-up alone took longer: issue #44.)
    script = tmp_path / "prompt.py"
    script.write_text(
        "import os, sys, time, fiber\n"
        "def ask():\n"
        "    sys.stdout.write('ready> ')\n"
        "    sys.stdout.flush()\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not os.path.exists('seen') and time.monotonic() < deadline:\n"
        "        time.sleep(0.02)\n"
        "    print('done' if os.path.exists('seen') else 'not seen')\n"
        "if __name__ == '__main__':\n"
        "    p = fiber.Process(target=ask); p.start(); p.join()\n")
    proc = subprocess.Popen([sys.executable, "-u", str(script)], stdout=subprocess.PIPE,
                            cwd=tmp_path)
    try:
        seen = b""
        while not seen.endswith(b"ready> "):
            seen += proc.stdout.read(1)
        (tmp_path / "seen").touch()
        assert proc.stdout.read() == b"done\n"
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()


PARENT_WRITES_IN_PIECES = """
import sys, time, fiber

def talk():
    for i in range(5):
        print("child line", i, flush=True)
        time.sleep(0.1)

if __name__ == "__main__":
    p = fiber.Process(target=talk)
    p.start()
    for i in range(8):  # the parent's own lines, each written in pieces meanwhile
        sys.stdout.write(f"parent line {i} begins ")
        time.sleep(0.1)
        sys.stdout.write("and ends\\n")
    p.join()
"""


def test_a_childs_line_never_lands_inside_a_line_the_parent_is_writing(run_script):
    """The parent writes its own lines in pieces while its child's lines arrive: every
    line comes out whole (a child's line used to flush the parent's unfinished one
    first, and went on after it: 'parent line 0 begins child line 0'). Run buffered, as
    Python runs by default (PYTHONUNBUFFERED empty): unbuffered, each piece reaches the
    descriptor at once, and multiprocessing's children cut into them there too."""
    result = run_script(PARENT_WRITES_IN_PIECES, env={"PYTHONUNBUFFERED": ""})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(lines) == sorted([f"parent line {i} begins and ends" for i in range(8)]
                                   + [f"child line {i}" for i in range(5)]), lines


def test_what_the_parent_printed_before_start_comes_first(run_script):
    """Buffered (Python's default for a pipe), the parent's line printed before
    start() shows before the child's lines, as multiprocessing flushes the standard
    streams when it starts a child; the parent's line printed after start() and not
    flushed comes at exit, after them, as there."""
    result = run_script("""
        import fiber
        if __name__ == "__main__":
            print("parent before start")
            p = fiber.Process(target=print, args=("child line",))
            p.start()
            p.join()
            print("parent after join")
    """, env={"PYTHONUNBUFFERED": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["parent before start", "child line",
                                          "parent after join"], result.stdout
