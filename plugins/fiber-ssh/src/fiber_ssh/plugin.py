"""fiber's hooks for the ssh backend: the backend class and its settings
(``ssh_hosts`` -> ``FIBER_SSH_HOSTS``, ...).

Every fiber process imports this module when it reads its settings (jobs of any backend
included), so it imports only fiber's contract; the backend, and paramiko (with
cryptography) with it, is imported by fiber's registry from the dotted path of
:data:`plugin`, the first time the ``ssh`` backend is used.
"""

from __future__ import annotations

from fiber.backend import (
    ConfigOption,
    Plugin,
    parse_bool,
    parse_list,
    parse_positive_float,
)


def _parse_port(text: str | int) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError("expected a port number 1-65535")
    return port


OPTIONS = [
    ConfigOption("ssh_hosts", parse_list, None,
                 "SSH hosts, comma-separated [user@]host[:port][*slots] (host may be a "
                 "~/.ssh/config alias; slots default to the host's CPU count)"),
    ConfigOption("ssh_hosts_file", str, None, "file with one SSH host entry per line"),
    ConfigOption("ssh_config_file", str, None,
                 "OpenSSH client config for host aliases (default ~/.ssh/config if present)"),
    ConfigOption("ssh_user", str, None, "login user when an entry names none (default: yours)"),
    ConfigOption("ssh_port", _parse_port, None, "port when an entry names none (default 22)"),
    ConfigOption("ssh_key_file", str, None,
                 "private key to log in with (default: the agent and ~/.ssh/id_*)"),
    ConfigOption("ssh_known_hosts", str, None,
                 "known-hosts file with the hosts' keys (default ~/.ssh/known_hosts)"),
    ConfigOption("ssh_accept_unknown_hosts", parse_bool, False,
                 "INSECURE: trust hosts whose key is not in the known-hosts file"),
    ConfigOption("ssh_when_full", str, "wait",
                 "when every slot is taken: wait (job stays pending) or fail",
                 choices=("wait", "fail")),
    ConfigOption("ssh_cwd", str, None,
                 "working directory of jobs on the hosts (default: the parent's cwd)"),
    ConfigOption("ssh_listen_address", str, None,
                 "this machine's address as the hosts reach it (default: the local address "
                 "of the SSH connection)"),
    ConfigOption("ssh_connect_timeout", parse_positive_float, 10.0,
                 "seconds to connect and log in to a host"),
    ConfigOption("ssh_start_timeout", parse_positive_float, 30.0,
                 "seconds create waits for a job's pid; a slower start leaves it PENDING"),
    ConfigOption("ssh_keepalive", parse_positive_float, 5.0,
                 "seconds between keepalives on idle connections"),
    ConfigOption("ssh_dead_after", parse_positive_float, 15.0,
                 "seconds without an answer after which a host is down and its jobs LOST"),
]


plugin = Plugin(
    package="fiber-ssh",
    contract=1,  # the version of fiber's plugin contract this package implements
    backends={"ssh": "fiber_ssh.backend:SSHBackend"},
    options=OPTIONS,
)
