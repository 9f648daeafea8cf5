"""The program tests/core/test_stranger.py probes: a Pool, a Manager, a shared Lock and
Value and a Listener, working in rounds until told to stop.

It writes ``ready.json`` (its pid, the Listener's address and the run's secret, so the
test can check that legitimate clients still get in: the one thing it learns from the
program rather than from the OS) and appends each round's duration to ``rounds.txt``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import fiber
from fiber.connection import Listener
from fiber.wire import auth


def square(x: int) -> int:
    return x * x


def serve(listener: Listener) -> None:
    while True:
        try:
            conn = listener.accept()
        except fiber.AuthenticationError:
            continue  # a stranger: the next one
        except OSError:
            return
        with conn:
            try:
                conn.send(("pong", conn.recv()))
            except (EOFError, OSError):
                pass


def main() -> None:
    out = sys.argv[1]
    with fiber.Pool(2) as pool, fiber.Manager() as manager:
        shared = manager.dict()
        lock, value = fiber.Lock(), fiber.Value("i", 0)
        listener = Listener()
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
        expected = [x * x for x in range(200)]
        assert pool.map(square, range(200)) == expected
        with open(os.path.join(out, "ready.json.tmp"), "w") as f:
            json.dump({"pid": os.getpid(), "listener": list(listener.address),
                       "key": auth.get_authkey().hex()}, f)
        os.rename(os.path.join(out, "ready.json.tmp"), os.path.join(out, "ready.json"))
        rounds = 0
        with open(os.path.join(out, "rounds.txt"), "a", buffering=1) as log:
            while not os.path.exists(os.path.join(out, "stop")):
                start = time.perf_counter()
                assert pool.map(square, range(200)) == expected
                shared["n"] = shared.get("n", 0) + 1
                with lock:
                    value.value += 1
                rounds += 1
                log.write(f"{time.time():.3f} {time.perf_counter() - start:.6f}\n")
                time.sleep(0.02)
        assert shared["n"] == rounds and value.value == rounds
        listener.close()
    with open(os.path.join(out, "done"), "w") as f:
        f.write(str(rounds))


if __name__ == "__main__":
    main()
