"""The server of multiprocessing's "Using a remote manager" example with the server
started by ``m.start()`` (for tests/ssh/test_remote_manager.py):
``python start_server.py MODULE HOST PORT``. Under fiber on the ssh backend the
manager's server is a job on an SSH host, listening at ``(HOST, PORT)`` (``HOST`` ""
for any address of that host, as the documentation's ``address=('', 50000)``). Prints
where it serves, waits until its stdin closes, shuts the manager down."""
import queue
import sys

if sys.argv[1] == "fiber":
    from fiber.managers import BaseManager
else:
    from multiprocessing.managers import BaseManager
_queues = {}
def get_queue():
    if "q" not in _queues:
        _queues["q"] = queue.Queue()
    return _queues["q"]
class QueueManager(BaseManager):
    pass
QueueManager.register('get_queue', callable=get_queue)
if __name__ == "__main__":
    m = QueueManager(address=(sys.argv[2], int(sys.argv[3])), authkey=b'abracadabra')
    m.start()
    print("serving", flush=True)
    print(*m.address, flush=True)
    sys.stdin.read()
    m.shutdown()
    print("shut down", flush=True)
