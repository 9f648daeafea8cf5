"""The server of multiprocessing's documented "Using a remote manager" example, for
tests/core/test_remote_manager.py: ``python server.py MODULE PORT`` (MODULE ``fiber`` or
``mp``) serves a queue with ``get_server().serve_forever()`` (``... HOST``: the host
part of its address, default 127.0.0.1; "" for every address of this machine, as the
documentation's, which tests/ssh/test_remote_manager.py's hosts reach it at)."""
import queue
import sys

if sys.argv[1] == "fiber":
    from fiber.managers import BaseManager
else:
    from multiprocessing.managers import BaseManager
q = queue.Queue()
class QueueManager(BaseManager):
    pass
QueueManager.register('get_queue', callable=lambda: q)
if __name__ == "__main__":
    host = sys.argv[3] if len(sys.argv) > 3 else '127.0.0.1'
    m = QueueManager(address=(host, int(sys.argv[2])), authkey=b'abracadabra')
    s = m.get_server()
    print("serving", flush=True)
    s.serve_forever()
