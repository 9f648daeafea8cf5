"""The client of multiprocessing's documented "Using a remote manager" example, for
tests/core/test_remote_manager.py: ``python client.py MODULE PORT put|get``, another
program than the server's, connecting with the same authkey (``... HOST``: the
server's host, default 127.0.0.1; tests/ssh/test_remote_manager.py connects to a server
on an SSH host)."""
import sys

if sys.argv[1] == "fiber":
    from fiber.managers import BaseManager
else:
    from multiprocessing.managers import BaseManager
class QueueManager(BaseManager):
    pass
QueueManager.register('get_queue')
if __name__ == "__main__":
    host = sys.argv[4] if len(sys.argv) > 4 else '127.0.0.1'
    m = QueueManager(address=(host, int(sys.argv[2])), authkey=b'abracadabra')
    m.connect()
    q = m.get_queue()
    if sys.argv[3] == "put":
        q.put('hello')
        print("put")
    else:
        print("got", q.get(timeout=10))
