"""A hub's channels are removed by finalizers (a Queue or a Pool collected), and the
garbage collector runs finalizers on whatever thread allocates, also one that holds the
hub's lock (a pool starting the hub's stream listener, seen in a full test run as a
hang of 300 s). This test does what the collector did: remove a channel from inside the
hub's lock, on a thread of its own so that a regression fails instead of hanging."""

from __future__ import annotations

import gc
import threading
import weakref

from fiber.wire.hub import Hub


class _Owner:
    """What owns a channel, as a Queue does (the hub holds the channel itself)."""


class _Channel:
    def handle(self, request, payload) -> None:  # pragma: no cover - never called
        raise AssertionError

    def peer_gone(self, peer: int) -> None:
        pass


def test_a_finalizer_may_remove_a_channel_while_the_hub_lock_is_held():
    hub = Hub("127.0.0.1")
    try:
        owner = _Owner()
        cid = hub.add_channel(_Channel())
        weakref.finalize(owner, hub.remove_channel, cid)

        def collect_inside_the_lock() -> None:
            nonlocal owner
            # private: the collector must run inside the hub's own lock, as it can in real use
            with hub._lock:  # as in Hub.stream_address, when the collector runs there
                del owner
                gc.collect()

        thread = threading.Thread(target=collect_inside_the_lock, daemon=True)
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "removing a channel from a finalizer deadlocked"
        assert hub.channel(cid) is None
    finally:
        hub.close()
