# multiprocessing documentation, "Listeners and Clients": the server, which creates a
# listener with 'secret password' as its authentication key, waits for a connection
# and sends some data to the client (fiber imported)
from fiber.connection import Listener
from array import array

address = ('localhost', 6000)     # family is deduced to be 'AF_INET'

with Listener(address, authkey=b'secret password') as listener:
    with listener.accept() as conn:
        print('connection accepted from', listener.last_accepted)

        conn.send([2.25, None, 'junk', float])

        conn.send_bytes(b'hello')

        conn.send_bytes(array('i', [42, 1729]))
