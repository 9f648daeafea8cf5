"""uber/fiber 0.2's documented classes by their old module paths: ``fiber.queues``'
Pipe, SimpleQueuePush, SimpleQueuePull and ZConnection, ``fiber.pool``'s ZPool and
ResilientZPool, ``fiber.config.Config`` and, as its Ring example asks for the address
a member listens at, ``fiber.backend.get_backend().get_listen_addr()``."""

import fiber
import fiber.config
from fiber.backend import get_backend
from fiber.pool import ResilientZPool, ZPool
from fiber.queues import Pipe, SimpleQueuePull, SimpleQueuePush, ZConnection


def echo(conn):
    conn.send(conn.recv() + 1)


def cube(x):
    return x ** 3


if __name__ == "__main__":
    parent, child = Pipe()
    p = fiber.Process(target=echo, args=(child,))
    p.start()
    parent.send(41)
    print("pipe", parent.recv(), isinstance(parent, ZConnection))
    p.join()
    for kind in (SimpleQueuePush, SimpleQueuePull):
        q = kind()
        q.put(kind.__name__)
        print("queue", q.get())
    for kind in (ZPool, ResilientZPool):
        pool = kind(2)
        print("pool", pool.map(cube, [1, 2, 3]))
        pool.close()
        pool.join()
    print("config", fiber.config.Config().backend)
    ip, port, ifname = get_backend().get_listen_addr()
    print("listen", ip, port, ifname != "")
