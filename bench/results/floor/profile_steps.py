"""Where a round trip's CPU goes, step by step (issue #29): reads a
``profile_roundtrip.py --cprofile DIR`` dump, charges each C builtin's own time to its
callers (in proportion to what each spent in it), groups every function's own time by
the step of ``apply_async(noop).get()`` it belongs to, and prints each step's share and
its microseconds scaled to a CPU time per round trip measured without the profiler.

    python bench/results/floor/profile_steps.py DIR/parent.prof parent CPU_US
    python bench/results/floor/profile_steps.py DIR/worker.prof worker CPU_US

Not part of the suite: ANALYSIS.md next to it says how it was used.
"""

from __future__ import annotations

import collections
import pstats
import sys

PARENT = [
    ("1 apply_async: checks, AsyncResult (2 locks)", ["pool.py:apply_async", "checks.py", "arguments.py", "results.py:__init__"]),
    ("2 scheduler: Task, function id, choose the worker", ["scheduler.py:submit_call", "tasks.py:__init__", "scheduler.py:func_id", "scheduler.py:dispatch_waiting", "scheduler.py:next_worker", "scheduler.py:idle_worker", "scheduler.py:relist", "scheduler.py:_usable", "tasks.py:free_line", "tasks.py:busy"]),
    ("3 scheduler: batch bookkeeping (held, dispatched, flags)", ["scheduler.py:send_batch", "scheduler.py:hand", "scheduler.py:<dictcomp>", "chunking.py"]),
    ("4 encode the task (pickle)", ["serialization.py:dumps", "serialization.py:_pickle", "serialization.py:<listcomp>"]),
    ("5 send (frame, sendmsg)", ["accepted.py:reply", "accepted.py:send"]),
    ("6 get(): direct read set-up, poll (waits not counted)", ["results.py:get", "results.py:wait", "channel.py:wait_directly", "accepted.py:read_until", "server.py:read_directly", "server.py:_after_direct_read", "channel.py:<lambda>", "server.py:_wake", "selectors.py"]),
    ("7 recv and framing", ["accepted.py:read$", "accepted.py:_read_buffer"]),
    ("8 dispatch to the pool's channel", ["server.py:_read_and_dispatch", "accepted.py:__init__", "hub.py:dispatch", "channel.py:direct", "lines.py", "server.py:on_selector_thread"]),
    ("9 channel: parse, lock, decode the result", ["channel.py:handle", "channel.py:_handle", "result_codec.py:decode", "serialization.py:loads"]),
    ("10 scheduler: result bookkeeping, line parked again", ["scheduler.py:results", "scheduler.py:timed", "scheduler.py:park", "scheduler.py:offer", "observe.py:tick"]),
    ("11 AsyncResult set (deliver, claim, release)", ["channel.py:deliver", "results.py:_set", "results.py:_finish"]),
]
WORKER = [
    ("1 wait for the batch: reader token / Condition", ["client.py:recv", "client.py:_wait", "client.py:_handed", "threading.py"]),
    ("2 recv and framing", ["client.py:_read_frame", "framing.py:check_reply"]),
    ("3 decode the batch", ["serialization.py:loads"]),
    ("4 run: loop, recall guard (Giver), the call", ["worker.py:run_batch", "worker.py:load_functions", "giver.py:begin", "giver.py:end_batch", "giver.py:guard", "tasks.py:noop"]),
    ("5 encode the result", ["worker.py:encode_results", "result_codec.py:encode", "serialization.py:dumps", "serialization.py:_pickle", "serialization.py:<listcomp>"]),
    ("6 send (frame, sendall)", ["client.py:send", "client.py:_send", "framing.py:request_frame"]),
]

def name(k: tuple) -> str:
    return k[2] if k[0] == "~" else k[0].split("/")[-1] + ":" + k[2]

def own(stats: dict) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for k, (_cc, _nc, tt, _ct, callers) in stats.items():
        if k[0] == "~" and callers:
            tot = sum(v[2] for v in callers.values()) or 1
            for ck, v in callers.items():
                out[name(ck)] += tt * v[2] / tot
        else:
            out[name(k)] += tt
    return out

def main(path: str, which: str, cpu_us: float) -> None:
    s = pstats.Stats(path)
    n = [v[1] for k, v in s.stats.items() if k[2] in ("apply_async", "run_batch")][0]
    o = own(s.stats)
    total = sum(o.values())
    steps = PARENT if which == "parent" else WORKER
    used = 0.0
    rows = []
    for label, keys in steps:
        # (a key ending in "$" names one function, else every name it begins)
        t = sum(v for f, v in o.items()
                if any(f == k[:-1] if k.endswith("$") else f.startswith(k) for k in keys))
        used += t
        rows.append((label, t))
    rows.append(("other", total - used))
    print(f"{path}: {total / n * 1e6:.0f} us under cProfile per round trip, scaled to {cpu_us} us")
    for label, t in rows:
        print(f"  {label:60s} {t / total * 100:5.1f}%  {t / total * cpu_us:5.1f} us")

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
