"""uber/fiber's first example: a function run in a fiber Process."""

import fiber


def hello(name):
    print(f"hello {name} from a fiber process", flush=True)


if __name__ == "__main__":
    p = fiber.Process(target=hello, args=("fiber",))
    p.start()
    p.join()
    print("exitcode", p.exitcode)
