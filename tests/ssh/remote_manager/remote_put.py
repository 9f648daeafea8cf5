"""A process that connects to the server of multiprocessing's "Using a remote
manager" example and puts into its queue (for tests/ssh/test_remote_manager.py):
``python remote_put.py MODULE HOST PORT``. Under fiber on the ssh backend the process
is a job on an SSH host, connecting back to the server program on the test's machine
at ``(HOST, PORT)``; it prints the name of the host it ran on."""
import socket
import sys

if sys.argv[1] == "fiber":
    from fiber import Process
    from fiber.managers import BaseManager
else:
    from multiprocessing import Process
    from multiprocessing.managers import BaseManager
class QueueManager(BaseManager):
    pass
QueueManager.register('get_queue')
def put(host, port):
    m = QueueManager(address=(host, port), authkey=b'abracadabra')
    m.connect()
    m.get_queue().put('hello')
    print("put on", socket.gethostname(), flush=True)
if __name__ == "__main__":
    p = Process(target=put, args=(sys.argv[2], int(sys.argv[3])))
    p.start()
    p.join()
    print("exitcode", p.exitcode)
