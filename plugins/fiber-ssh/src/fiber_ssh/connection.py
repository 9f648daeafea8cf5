"""One pooled SSH connection per host: connecting (host key policy, key auth),
liveness (keepalives plus ``TCP_USER_TIMEOUT``), running short commands, and turning
paramiko's exceptions into fiber errors that say what to do.

All jobs on a host share one :class:`paramiko.Transport`; each job is one session
channel on it. paramiko ignores the ``exit-signal`` channel request OpenSSH sends when
the remote process was killed by a signal, so :class:`_Transport` records it on the
channel (``chan.fiber_exit_signal``) to report ``-N`` exactly.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Any

import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST
from paramiko.message import Message

from fiber.backend import ClusterUnreachableError
from fiber_ssh.hosts import HostSpec

logger = logging.getLogger("fiber.ssh")


def _handle_request(chan: paramiko.Channel, m: Message) -> None:
    position = m.packet.tell()
    key = m.get_text()
    if key == "exit-signal":
        m.get_boolean()  # want_reply: always false for exit-signal
        name = m.get_text()
        try:
            number = int(signal.Signals["SIG" + name])
        except KeyError:
            number = 0
        chan.fiber_exit_signal = (name, number)  # type: ignore[attr-defined]  # our own attribute, read by the backend
        chan.exit_status = -number if number else 255
        chan.status_event.set()
        return
    m.packet.seek(position)
    paramiko.Channel._handle_request(chan, m)  # type: ignore[attr-defined]  # paramiko's private handler (not in its stubs)


class _Transport(paramiko.Transport):
    """A transport that also understands ``exit-signal``."""

    _channel_handler_table = {
        **paramiko.Transport._channel_handler_table,  # type: ignore[attr-defined]  # private, not in the stubs
        MSG_CHANNEL_REQUEST: _handle_request,
    }


def _transport_of(client: paramiko.SSHClient, name: str) -> paramiko.Transport:
    """The transport of a connected client (a client has none once closed)."""
    transport = client.get_transport()
    if transport is None:
        raise ClusterUnreachableError(f"SSH host {name}: the connection is closed")
    return transport


class HostConnection:
    """The pooled connection to one host (connects lazily, reconnects never: a host
    whose transport died is down for the rest of the backend's life). A first
    connection that failed transiently (refused, timed out: the host or its sshd is
    not up yet) is tried again on the next :meth:`connect`; one that failed for good
    (authentication, host key, a setting) is not (docs/backend-errors.md)."""

    def __init__(self, spec: HostSpec, options: dict[str, Any]) -> None:
        self.spec = spec
        self.options = options
        self._lock = threading.Lock()
        self._client: paramiko.SSHClient | None = None
        # more connections, opened only when sshd's MaxSessions limit is reached
        self._extra: list[paramiko.SSHClient] = []
        self.error: Exception | None = None
        self._closed = False
        self.cpus: int | None = None
        self.memory: int | None = None  # MiB

    # -- connecting ---------------------------------------------------------------
    def connect(self) -> paramiko.Transport:
        """The live transport, connecting on first use. Raises
        :class:`ClusterUnreachableError` with a reason and a remedy."""
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                raise ClusterUnreachableError(
                    f"SSH host {self.spec.name} ({self.spec.label}) is no longer reachable "
                    "(its connection died); its jobs are lost"
                )
            if self.error is not None:
                transient = getattr(self.error, "transient", True)
                if self._closed or not transient:
                    raise ClusterUnreachableError(str(self.error), transient=transient)
                logger.debug("trying SSH host %s again (%s)", self.spec.name, self.error)
                self.error = None  # never connected, and worth another try
            try:
                self._client = self._open()
            except ClusterUnreachableError as exc:
                self.error = exc
                raise
            return _transport_of(self._client, self.spec.name)

    @property
    def alive(self) -> bool:
        clients = [self._client, *self._extra] if self._client is not None else []
        transports = [client.get_transport() for client in clients]
        return bool(transports) and all(t is not None and t.is_active() for t in transports)

    def _socket(self, timeout: float) -> socket.socket:
        spec = self.spec
        try:
            infos = socket.getaddrinfo(spec.hostname, spec.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ClusterUnreachableError(
                f"unknown SSH host {spec.hostname!r} (entry {spec.name!r}): {exc.strerror}; "
                "fix the name in FIBER_SSH_HOSTS / the hosts file, or add a Host alias to "
                "~/.ssh/config", transient=False
            ) from None
        last: OSError | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(timeout)
            if hasattr(socket, "TCP_USER_TIMEOUT"):
                # unacknowledged data (our keepalives) for this long kills the connection,
                # so a host that vanishes is noticed in seconds, not after TCP's ~15 min
                dead_after = float(self.options.get("ssh_dead_after") or 15.0)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                int(dead_after * 1000))
            try:
                sock.connect(address)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise ClusterUnreachableError(
            f"cannot connect to SSH host {spec.name} ({spec.hostname} port {spec.port}): "
            f"{getattr(last, 'strerror', None) or last}; check that sshd runs there and "
            "that the port is right (entry syntax user@host:port)"
        )

    def _open(self) -> paramiko.SSHClient:
        spec = self.spec
        timeout = float(self.options.get("ssh_connect_timeout") or 10.0)
        client = paramiko.SSHClient()
        known = self.options.get("ssh_known_hosts") or "~/.ssh/known_hosts"
        known_path = os.path.expanduser(known)
        if os.path.exists(known_path):
            client.load_system_host_keys(known_path)
        elif self.options.get("ssh_known_hosts"):
            raise ClusterUnreachableError(
                f"the known-hosts file {known_path!r} (setting ssh_known_hosts) does not exist",
                transient=False)
        if self.options.get("ssh_accept_unknown_hosts"):
            logger.warning("accepting unknown SSH host keys (ssh_accept_unknown_hosts is set; "
                           "insecure: a man in the middle would not be noticed)")
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        key_file = spec.key_file and os.path.expanduser(spec.key_file)
        if key_file and not os.path.exists(key_file):
            raise ClusterUnreachableError(
                f"the SSH key file {key_file!r} (setting ssh_key_file) does not exist",
                transient=False)
        sock = self._socket(timeout)
        try:
            client.connect(
                spec.hostname, port=spec.port, username=spec.user, key_filename=key_file,
                look_for_keys=not key_file, allow_agent=not key_file, timeout=timeout,
                banner_timeout=timeout, auth_timeout=timeout, sock=sock,
                transport_factory=_Transport,  # type: ignore[arg-type]  # types-paramiko's factory protocol still has the gss arguments paramiko 5 dropped
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            sock.close()
            raise ClusterUnreachableError(
                f"the host key of SSH host {spec.name} ({spec.hostname}:{spec.port}) does NOT "
                f"match the one in {known_path} (expected {exc.expected_key.get_name()} "
                f"{exc.expected_key.get_fingerprint().hex()}, got "
                f"{exc.key.get_fingerprint().hex()}): this may be a man-in-the-middle attack. "
                "If the host was reinstalled, verify its new key and replace the old one "
                f"(ssh-keygen -R '[{spec.hostname}]:{spec.port}' -f {known_path})",
                transient=False) from None
        except paramiko.SSHException as exc:
            client.close()
            sock.close()
            text = str(exc)
            if "not found in known_hosts" in text:
                raise ClusterUnreachableError(
                    f"the host key of SSH host {spec.name} ({spec.hostname}:{spec.port}) is not "
                    f"in the known-hosts file {known_path}, so the host is not trusted. Verify "
                    "its key and add it (ssh-keyscan -p PORT HOST >> FILE, or ssh to it once), "
                    "point FIBER_SSH_KNOWN_HOSTS at a file that has it, or set "
                    "FIBER_SSH_ACCEPT_UNKNOWN_HOSTS=true (insecure)", transient=False
                ) from None
            if "No authentication methods" in text:
                raise ClusterUnreachableError(
                    f"no key to log in to SSH host {spec.name} ({spec.hostname}:{spec.port}) "
                    "with: set FIBER_SSH_KEY_FILE, add an IdentityFile to ~/.ssh/config, or "
                    "start an ssh-agent", transient=False
                ) from None
            if isinstance(exc, paramiko.AuthenticationException):
                raise ClusterUnreachableError(
                    f"SSH host {spec.name} ({spec.hostname}:{spec.port}) refused to log in user "
                    f"{spec.user!r} with {'key ' + key_file if key_file else 'the default keys'}"
                    f" ({text}); add the public key to ~{spec.user}/.ssh/authorized_keys on "
                    "the host, or set FIBER_SSH_KEY_FILE / FIBER_SSH_USER", transient=False
                ) from None
            raise ClusterUnreachableError(
                f"SSH to host {spec.name} ({spec.hostname}:{spec.port}) failed: {text}"
            ) from None
        except OSError as exc:
            client.close()
            sock.close()
            raise ClusterUnreachableError(
                f"SSH to host {spec.name} ({spec.hostname}:{spec.port}) failed: {exc}"
            ) from None
        transport = _transport_of(client, spec.name)
        transport.set_keepalive(max(1, int(float(self.options.get("ssh_keepalive") or 5.0))))
        logger.debug("connected to %s", spec.label)
        return client

    # -- using it -----------------------------------------------------------------
    def open_channel(self) -> paramiko.Channel:
        """A new session channel. Channels share the host's connection; when sshd
        refuses another session on it (its ``MaxSessions``, 10 by default), the next
        connection is tried, and a new one opened when all are full."""
        timeout = float(self.options.get("ssh_connect_timeout") or 10.0)
        transports = [self.connect()]
        with self._lock:
            transports += [_transport_of(client, self.spec.name) for client in self._extra]
        for transport in transports:
            try:
                return transport.open_session(timeout=timeout)
            except paramiko.ChannelException:
                continue  # this connection has its maximum of sessions
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise ClusterUnreachableError(
                    f"SSH host {self.spec.name} did not open a session: {exc}"
                ) from None
        with self._lock:
            client = self._open()
            self._extra.append(client)
        logger.debug("%s: sessions limit reached, opened connection %d", self.spec.name,
                     len(self._extra) + 1)
        try:
            return _transport_of(client, self.spec.name).open_session(timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ClusterUnreachableError(
                f"SSH host {self.spec.name} did not open a session on a new connection: "
                f"{exc}; check MaxSessions / MaxStartups in its sshd_config"
            ) from None

    def run(self, command: str, timeout: float = 30.0) -> tuple[int, str]:
        """Run a short command; return its exit status and output (stdout+stderr)."""
        chan = self.open_channel()
        try:
            chan.settimeout(timeout)
            chan.set_combine_stderr(True)
            chan.exec_command(command)
            chan.shutdown_write()
            chunks = []
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                chunks.append(data)
            return chan.recv_exit_status(), b"".join(chunks).decode("utf-8", "replace")
        except (TimeoutError, paramiko.SSHException, OSError) as exc:
            raise ClusterUnreachableError(
                f"command on SSH host {self.spec.name} failed: {exc}"
            ) from None
        finally:
            chan.close()

    def probe(self) -> None:
        """Read the host's CPU count and total memory once (the answer is marked, so
        whatever the login shell prints around it does not matter)."""
        if self.cpus is not None:
            return
        _, out = self.run(
            'echo "FIBER-SSH-PROBE $(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN) '
            "$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)\"")
        cpus, memory = 1, None
        words = out[out.rfind("FIBER-SSH-PROBE"):].splitlines()[0].split()[1:] \
            if "FIBER-SSH-PROBE" in out else []
        try:
            cpus = int(words[0])
        except (IndexError, ValueError):
            logger.warning("cannot read the CPU count of %s (%r); assuming 1", self.spec.name,
                           out[-300:])
        try:
            memory = int(words[1]) // 1024
        except (IndexError, ValueError):
            memory = None
        self.cpus, self.memory = cpus, memory

    def close(self) -> None:
        with self._lock:
            clients = [self._client, *self._extra] if self._client is not None else []
            self._client, self._extra = None, []
            self._closed = True
            if self.error is None:
                self.error = ClusterUnreachableError(
                    f"the connection to SSH host {self.spec.name} was closed")
        for client in clients:
            client.close()
