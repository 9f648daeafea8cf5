"""uber/fiber's shared-data example: processes fill a dict served by a Manager."""

import fiber


def record(shared, key):
    shared[key] = key * key


if __name__ == "__main__":
    manager = fiber.Manager()
    shared = manager.dict()
    procs = [fiber.Process(target=record, args=(shared, i)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print("shared", sorted(shared.items()))
    manager.shutdown()
