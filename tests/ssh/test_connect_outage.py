"""A connection begun while its host is cut off waits for the link within the connect
time, instead of failing at once.

A pool worker that starts while its SSH host's link is down (a switch, a network
restart) used to fail its first connection back with EHOSTUNREACH and be lost, while
the workers already connected rode out the same outage (tests/ssh/test_faults.py saw
it). Here a real host (a network namespace with its own veth) connects to a listener of
this machine through fiber's stream wire while its veth is down for 6 s: the kernel's
own "no route to host", no fake.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from ssh_helpers import set_link

CODE = """
import sys, time
from fiber.wire.stream.framing import connect
began = time.monotonic()
sock = connect(sys.argv[1], int(sys.argv[2]), None, 10.0)
sock.sendall(b"hello")
print(round(time.monotonic() - began, 2))
"""


def test_a_connection_begun_in_an_outage_is_made_when_the_link_is_back(ssh_hosts):
    address = ssh_hosts["local_address"]
    host = ssh_hosts["hosts"][1]
    with socket.create_server((address, 0)) as listener:
        listener.settimeout(30)
        port = listener.getsockname()[1]
        set_link(ssh_hosts, 1, up=False)
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", host["namespace"], sys.executable, "-c", CODE,
                 address, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            time.sleep(6)  # longer than the kernel takes to say "no route to host"
        finally:
            set_link(ssh_hosts, 1, up=True)
        try:
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert 5.5 <= float(out) <= 10.5, out  # it waited for the link, within the time
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            assert conn.recv(5) == b"hello"


def test_a_connection_whose_packets_are_dropped_is_made_soon_after_they_pass(ssh_hosts):
    """The other outage: the host's link is up but its packets go nowhere (an iptables
    DROP of its outgoing SYNs, in its namespace, for 7.5 s). The kernel sends a SYN
    again only after 1, 3, 7 and 15 s, so one attempt would next try at 15 s, past the
    10 s the connect has (before: "timed out"); attempts of at most
    ``ATTEMPT_SECONDS`` each connect within about that of the drop's end."""
    address = ssh_hosts["local_address"]
    host = ssh_hosts["hosts"][1]
    in_host = ["ip", "netns", "exec", host["namespace"], "iptables"]
    with socket.create_server((address, 0)) as listener:
        listener.settimeout(30)
        port = listener.getsockname()[1]
        rule = ["OUTPUT", "-p", "tcp", "-d", address, "--dport", str(port), "-j", "DROP"]
        subprocess.run([*in_host, "-I", *rule], check=True)
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", host["namespace"], sys.executable, "-c", CODE,
                 address, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            time.sleep(7.5)
        finally:
            subprocess.run([*in_host, "-D", *rule], check=True)
        try:
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert 7.0 <= float(out) <= 10.5, out  # made after the drop, within the time
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            assert conn.recv(5) == b"hello"
