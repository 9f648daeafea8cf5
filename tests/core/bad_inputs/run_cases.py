"""Runs the bad-input cases of ``tests/core/test_bad_inputs.py`` in one module and
prints one JSON line per case: ``{"label", "outcome", "seconds"}`` (``outcome`` is
``"ExcType: message"``, ``"returns <repr>"`` or ``"hangs"``).

``python run_cases.py fiber`` runs every case against fiber in this process (each in a
thread, given ``HANG`` seconds), then checks that no job is left (the local backend's
template has no child) and prints ``{"left": [pids]}``. ``python run_cases.py
multiprocessing LABEL`` runs one case against multiprocessing (the test runs each in a
process of its own, killed with its children if it hangs).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from cases import CASES  # noqa: E402

HANG = 10.0


def f(x):
    return x


def run(mp, label, setup, call):
    namespace = {"mp": mp, "f": f}
    exec(setup, namespace)
    box = {}

    def target():
        started = time.monotonic()
        try:
            value = eval(call, namespace)
            shown = repr(value)
            if " at 0x" in shown:  # an object's address changes from run to run
                shown = f"a {type(value).__name__}"
            box["outcome"] = f"returns {shown}"[:80]
        except BaseException as exc:  # noqa: BLE001 - the outcome is what is measured
            message = str(exc).splitlines()[0] if str(exc) else ""
            box["outcome"] = f"{type(exc).__name__}: {message}".rstrip(": ").rstrip()
        box["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG)
    outcome = box.get("outcome", "hangs")
    print(json.dumps({"label": label, "outcome": outcome,
                      "seconds": box.get("seconds", HANG)}), flush=True)
    for value in namespace.values():  # what the case made: pools, processes
        for end in ("terminate", "join"):
            try:
                if hasattr(value, end) and not isinstance(value, type):
                    getattr(value, end)()
            except Exception:  # noqa: BLE001 - a failed case's half-made objects
                pass


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(c) for c in fh.read().split()]
    except OSError:
        return []


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "fiber":
        import fiber

        for label, setup, call, _mp_call, _bound in CASES:
            run(fiber, label, setup, call)
            fiber.reset()  # a case may have given settings (fiber.init)
        deadline = time.monotonic() + 5
        while True:
            left = [job for t in children(os.getpid()) for job in children(t)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        print(json.dumps({"left": left}), flush=True)
    else:
        mp = importlib.import_module("multiprocessing")
        for label, setup, _call, mp_call, _bound in CASES:
            if label == sys.argv[2]:
                run(mp, label, setup, mp_call)
    os._exit(0)
