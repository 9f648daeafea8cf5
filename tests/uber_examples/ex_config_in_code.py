"""uber/fiber's settings in code (its fiber.config documentation): the settings are
attributes of ``fiber.config``, set before the first process starts; its queue
documentation switches SimpleQueue's kind with ``fiber.config.use_push_queue``."""

import fiber
import fiber.config as fiber_config


def square(x):
    return x * x


def main():
    fiber_config.log_level = "debug"
    fiber_config.log_file = "stdout"
    fiber_config.backend = "local"

    q = fiber.SimpleQueue()
    q.put(42)
    fiber.config.use_push_queue = True
    q2 = fiber.SimpleQueue()
    q2.put(q.get())
    print("queued", q2.get(), fiber.config.backend, fiber.config.get_dict()["backend"])
    pool = fiber.Pool(processes=2)
    print("squares", pool.map(square, range(5)))
    pool.terminate()


if __name__ == "__main__":
    main()
