"""uber/fiber's queue example: a worker process answers through a SimpleQueue."""

import fiber


def double(q_in, q_out):
    while True:
        item = q_in.get()
        if item is None:
            break
        q_out.put(item * 2)


if __name__ == "__main__":
    q_in, q_out = fiber.SimpleQueue(), fiber.SimpleQueue()
    worker = fiber.Process(target=double, args=(q_in, q_out), daemon=True)
    worker.start()
    for i in range(5):
        q_in.put(i)
    results = [q_out.get() for _ in range(5)]
    q_in.put(None)
    worker.join()
    print("doubled", results)
