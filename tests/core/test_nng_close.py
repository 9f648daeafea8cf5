"""A pynng context closed by two threads at once (a hub closing its contexts while one
of them is closed by its own thread) closes once, without an error (pynng's close read
the context after another thread had cleared it: TypeError, seen at a hub's close in a
CI run). Real pynng sockets and contexts."""

from __future__ import annotations

import threading

import pynng

from fiber.wire.nng import Context


def test_a_context_closed_by_two_threads_at_once_closes_quietly():
    errors: list[BaseException] = []
    with pynng.Rep0() as sock:
        for _ in range(300):
            ctx = Context(sock)
            gate = threading.Barrier(2)

            def close(ctx: Context = ctx, gate: threading.Barrier = gate) -> None:
                gate.wait()
                try:
                    ctx.close()
                except BaseException as exc:  # noqa: BLE001 - what the test looks for
                    errors.append(exc)

            threads = [threading.Thread(target=close) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert errors == []
