"""One Pool program, written against multiprocessing's documented Pool API (the
patterns of the Pool example in the documentation's "Examples" section: apply,
apply_async, map, imap, imap_unordered with and without chunksize, errors raised in
tasks and where they surface, get() with a timeout), run twice: with the standard
library and with ``import fiber as multiprocessing``. The two outputs must be the same,
line for line."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys, time
if sys.argv[1] == "fiber":
    import fiber as multiprocessing
else:
    import multiprocessing

def mul(a, b):
    time.sleep(0.005)
    return a * b

def plus(a, b):
    return a + b

def star(args):
    fn, a, b = args
    return f"{fn.__name__}({a}, {b}) = {fn(a, b)}"

def inverse(x):
    return 1.0 / (x - 5)

def pow3(x):
    return x ** 3

if __name__ == "__main__":
    tasks = [(mul, i, 7) for i in range(10)] + [(plus, i, 8) for i in range(10)]
    with multiprocessing.Pool(4) as pool:
        print(sorted(r.get() for r in [pool.apply_async(star, (t,)) for t in tasks]))
        print(pool.map(star, tasks))
        print(list(pool.imap(star, tasks)))
        print(sorted(pool.imap_unordered(star, tasks)))
        print(pool.map(pow3, range(100), chunksize=7) == [x ** 3 for x in range(100)])
        print(list(pool.imap(pow3, range(100), chunksize=9)) == [x ** 3 for x in range(100)])
        print(sorted(pool.imap_unordered(pow3, range(50), chunksize=4)))
        try:
            pool.apply(inverse, (5,))
        except ZeroDivisionError as exc:
            print("apply raised", type(exc).__name__)
        try:
            pool.map(inverse, range(10))
        except ZeroDivisionError as exc:
            print("map raised", type(exc).__name__)
        it = pool.imap(inverse, range(10))
        seen = []
        for _ in range(10):
            try:
                seen.append(round(next(it), 3))
            except ZeroDivisionError:
                seen.append("error")
        print(seen)
        try:
            next(it)
        except StopIteration:
            print("imap ended")
        slow = pool.apply_async(time.sleep, (2,))
        try:
            slow.get(timeout=0.05)
        except multiprocessing.TimeoutError:
            print("timed out", slow.ready())
        print(slow.get(timeout=30), slow.successful())
        result = pool.map_async(pow3, range(10))
        result.wait(30)
        print(result.ready(), result.successful(), result.get())
"""


def _run(tmp_path, which: str) -> list[str]:
    script = tmp_path / "pool_program.py"
    script.write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(script), which], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_pool_program_prints_what_multiprocessing_prints(tmp_path):
    expected = _run(tmp_path, "multiprocessing")
    assert len(expected) == 14 and "imap ended" in expected  # the program ran through
    assert _run(tmp_path, "fiber") == expected
