"""uber/fiber's async manager example: remote objects stepped in parallel."""

import time

from fiber.managers import AsyncManager


class Counter:
    def __init__(self, start):
        self.value = start

    def step(self, delay):
        time.sleep(delay)
        self.value += 1
        return self.value


class CounterManager(AsyncManager):
    pass


CounterManager.register("Counter", Counter)

if __name__ == "__main__":
    manager = CounterManager()
    manager.start()
    counters = [manager.Counter(i * 10) for i in range(4)]
    started = time.monotonic()
    handles = [c.step(0.5) for c in counters]  # return at once
    values = [h.get() for h in handles]
    parallel = time.monotonic() - started < 1.5  # four 0.5 s steps overlapped
    print("stepped", values, parallel)
    manager.shutdown()
