"""Group a ``profile_roundtrip.py --cprofile`` profile's CPU by what the code does.

    python bench/results/floor/cprofile_summary.py DIR/parent.prof ROUND_TRIPS

Each function's own CPU (``tottime`` under ``time.thread_time``) goes to one category;
a C builtin's (``len``, ``dict.get``, ``struct.pack``...) goes to its callers' categories
in proportion to their calls, except the socket and selector calls, which are the wire's
system calls. Prints the share of each category and its CPU per round trip.
"""

from __future__ import annotations

import collections
import pstats
import sys

SYSCALLS = ("sendmsg", "sendall", "recv_into", "'poll'", "'select'", "epoll", "'register'",
            "'unregister'", "'modify'")
RULES = (  # (category, substrings of "file:function"), first match wins
    ("serialization (pickle, encode/decode of messages)",
     ("serialization.py", "encode_results", "_pickle", "pickle", "load_functions")),
    ("wire: framing and reading/writing in Python",
     ("wire/stream", "framing.py", "wire/hub.py")),
    ("thread hand-off (locks, conditions, result wake-up)",
     ("threading.py", "lock", "RLock", "results.py:52(wait", "results.py", "Condition")),
    ("scheduler and pool bookkeeping", ("scheduler.py", "channel.py", "pool.py", "worker.py")),
    ("wire: system calls", ("selectors.py",)),
)


def category(key: tuple[str, int, str]) -> str:
    name = f"{key[0]}:{key[1]}({key[2]})"
    if key[0] == "~" and any(s in name for s in SYSCALLS):
        return "wire: system calls"
    for cat, subs in RULES:
        if any(s in name for s in subs):
            return cat
    return "other"


def main(path: str, trips: int) -> None:
    st = pstats.Stats(path)
    cpu: collections.Counter[str] = collections.Counter()
    for key, (_, _nc, tt, _, callers) in st.stats.items():
        cat = category(key)
        if key[0] == "~" and cat == "other" and callers:
            calls = sum(v[1] for v in callers.values()) or 1
            for ck, v in callers.items():
                cpu[category(ck)] += tt * v[1] / calls
        else:
            cpu[cat] += tt
    total = sum(cpu.values())
    print(f"{path}: {total / trips * 1e6:.1f} us CPU per round trip under cProfile")
    for cat, t in cpu.most_common():
        print(f"  {100 * t / total:5.1f}%  {cat}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
