"""Bring up (``up``) and tear down (``down``) the ssh backend's test hosts.

Each host is a network namespace with its own ``sshd`` and hostname. The namespaces
hang off a bridge of this machine through veth pairs; the bridge carries the first
address of a small loopback-range subnet (the first free ``127.10.0.(32+16k)/28``,
k = 0..7, with interface prefix ``fssh<k>-``: for k = 0, 127.10.0.33 is this machine
and 127.10.0.34, .35, ... are the hosts; ``route_localnet`` makes 127/8 addresses
routable on those links). Nothing listens outside these addresses.

    python3 hosts.py up   --dir DIR [--count 2] [--net NET --prefix P] [--port 2222]
                          [--hide DIR ...]
    python3 hosts.py down --dir DIR

``--hide DIR`` (repeatable) makes *bare* hosts: each sshd runs in a mount namespace of
its own where every DIR named is an empty tmpfs and ``/tmp`` is a tmpfs of the host's
own (DIR itself is bound back in it), so that the host sees the system's Python and
nothing of the developer's (the repository, the test environment, pyenv): what a
cluster's node looks like to a program shipped to it (issue #38).

``up`` writes ``DIR/state.json`` (namespaces, bridge, pids, iptables rule, keys),
registers DIR with the owning test process's pid under /run/fiber-ssh-test-hosts (hosts
whose owner died are torn down by the next ``up``) and prints the state; ``down``
reads it, kills every process left in the namespaces and the sshds (by pid), deletes
the veths, the namespaces, the bridge and the iptables rule it added, and removes DIR.
Both need root.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
REGISTRY = Path("/run/fiber-ssh-test-hosts")

SSHD_CONFIG = """\
ListenAddress {address}
Port {port}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {auth}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100:30:200
MaxSessions 100
AcceptEnv none
PrintMotd no
SetEnv HOME={home}
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def _ns_inode(ns: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{ns}").st_ino
    except OSError:
        return None


def pids_in_namespaces(namespaces: list[str]) -> list[int]:
    """Every process whose network namespace is one of ours."""
    inodes = {i for i in (_ns_inode(ns) for ns in namespaces) if i is not None}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                found.append(int(entry))
        except OSError:
            continue
    return found


def _wait_port(address: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), 1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _conflict(prefix: str, net: ipaddress.IPv4Network, count: int) -> str | None:
    """Why ``prefix``/``net`` cannot be used now, or ``None``."""
    addrs = list(net.hosts())
    if len(addrs) < count + 1:
        return f"subnet {net} has room for fewer than {count} hosts"
    taken = sh("ip", "-o", "addr", "show").stdout
    for addr in addrs[: count + 1]:
        if f"inet {addr}/" in taken:
            return f"address {addr} is already in use on this machine"
    for ifname in [f"{prefix}br"] + [f"{prefix}v{i}" for i in range(1, count + 1)]:
        if sh("ip", "link", "show", ifname, check=False).returncode == 0:
            return f"network interface {ifname} already exists"
    for i in range(1, count + 1):
        if os.path.exists(f"/run/netns/{prefix}h{i}"):
            return f"network namespace {prefix}h{i} already exists"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reclaim_stale() -> None:
    """Tear down test hosts of earlier sessions whose test process is gone (killed
    before it could stop them); they were made by this script (registry in /run)."""
    if not REGISTRY.is_dir():
        return
    for entry in REGISTRY.glob("*.json"):
        try:
            record = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(record.get("owner", 0))):
            continue
        down_dir(Path(record["dir"]), record)
        entry.unlink(missing_ok=True)


def choose(args: argparse.Namespace) -> tuple[str, ipaddress.IPv4Network]:
    """The interface prefix and subnet: the given ones, or the first free slot
    ``fssh<k>-`` / ``127.10.0.(32+16k)/28`` (so sessions can run side by side)."""
    if args.net or args.prefix:
        prefix = args.prefix or "fssh-"
        net = ipaddress.ip_network(args.net or "127.10.0.32/28")
        problem = _conflict(prefix, net, args.count)
        if problem:
            sys.exit(f"cannot make the ssh test hosts: {problem}; tear down the old test "
                     "hosts (hosts.py down) or pick another --net / --prefix (FSSH_TEST_NET)")
        return prefix, net
    problems = []
    for k in range(8):
        prefix = f"fssh{k}-"
        net = ipaddress.ip_network(f"127.10.0.{32 + 16 * k}/28")
        problem = _conflict(prefix, net, args.count)
        if problem is None:
            return prefix, net
        problems.append(problem)
    sys.exit("cannot make the ssh test hosts, every slot is taken: " + "; ".join(problems))


def up(args: argparse.Namespace) -> dict:
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    reclaim_stale()
    prefix, net = choose(args)
    addrs = list(net.hosts())
    bridge = f"{prefix}br"
    REGISTRY.mkdir(parents=True, exist_ok=True)
    (REGISTRY / f"{prefix}.json").write_text(json.dumps(
        {"dir": str(base), "owner": args.owner or os.getppid(), "prefix": prefix,
         "count": args.count}))
    state: dict = {"dir": str(base), "bridge": bridge, "namespaces": [], "sshd_pids": [],
                   "iptables": None, "hosts": [], "net": str(net), "prefix": prefix}
    state_path = base / "state.json"

    def save() -> None:
        state_path.write_text(json.dumps(state, indent=2))

    save()
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    client_key = base / "client_ed25519"
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fiber-ssh-test-client",
       "-f", str(client_key))
    # the login shell of the sessions reads $HOME/.bashrc: give them a clean home, so
    # that root's own ~/.bashrc (pyenv init: slow, takes a machine-wide lock) stays out
    home = base / "home"
    home.mkdir()
    auth = base / "authorized_keys"
    shutil.copy(f"{client_key}.pub", auth)
    state["key_file"] = str(client_key)

    sh("ip", "link", "add", bridge, "type", "bridge")
    state["bridge_created"] = True
    save()
    local = str(addrs[0])
    sh("ip", "addr", "add", f"{local}/{net.prefixlen}", "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    sh("sysctl", "-qw", f"net.ipv4.conf.{bridge}.route_localnet=1")
    rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
    if shutil.which("iptables") and sh("iptables", "-C", *rule, check=False).returncode != 0:
        if sh("iptables", "-I", *rule, check=False).returncode == 0:
            state["iptables"] = rule
    state["local_address"] = local
    save()

    known_hosts = []
    for i in range(1, args.count + 1):
        name = f"h{i}"
        ns = f"{prefix}{name}"
        veth = f"{prefix}v{i}"
        address = str(addrs[i])
        hdir = base / name
        hdir.mkdir()
        sh("ip", "netns", "add", ns)
        state["namespaces"].append(ns)
        state["hosts"].append({"name": name, "namespace": ns, "veth": veth,
                               "address": address, "port": args.port})
        save()
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", bridge, "up")
        sh("ip", "-n", ns, "addr", "add", f"{address}/{net.prefixlen}", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1",
           "net.ipv4.conf.eth0.route_localnet=1")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fiber-ssh-test-{name}",
           "-f", str(hdir / "ssh_host_ed25519_key"))
        (hdir / "sshd_config").write_text(SSHD_CONFIG.format(
            address=address, port=args.port, dir=hdir, auth=auth, home=home))
        log = open(hdir / "sshd.log", "wb")  # noqa: SIM115 -- handed to sshd
        script = f'hostname {name} && exec {SSHD} -D -e -f "$1"'
        unshare = ["unshare", "--uts"]
        if args.hide:
            keep = f"/run/fiber-ssh-keep-{ns}"
            state.setdefault("keep_dirs", []).append(keep)
            hidden = " ".join(shlex.quote(d) for d in args.hide)
            script = (
                f"hostname {name} && mkdir -p {keep} && mount --bind {base} {keep} && "
                f"for d in {hidden}; do if [ -d \"$d\" ]; then "
                "mount -t tmpfs -o size=1m,mode=0755 fiber-hidden \"$d\" || exit 1; fi; "
                "done && mount -t tmpfs -o mode=1777 fiber-host-tmp /tmp && "
                f"mkdir -p {base} && mount --bind {keep} {base} && "
                f'exec {SSHD} -D -e -f "$1"')
            unshare += ["--mount", "--propagation", "private"]
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{ns}", *unshare, "sh", "-c", script, "sh",
             str(hdir / "sshd_config")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        state["sshd_pids"].append(proc.pid)
        pub = (hdir / "ssh_host_ed25519_key.pub").read_text().split()
        known_hosts.append(f"[{address}]:{args.port} {pub[0]} {pub[1]}")
        state["hosts"][-1].update(sshd_pid=proc.pid, host_key=f"{pub[0]} {pub[1]}")
        save()
    known = base / "known_hosts"
    known.write_text("\n".join(known_hosts) + "\n")
    state["known_hosts"] = str(known)
    for host in state["hosts"]:
        try:
            _wait_port(host["address"], host["port"])
        except OSError:
            log_text = (base / host["name"] / "sshd.log").read_text(errors="replace")
            save()
            sys.exit(f"sshd of {host['name']} did not come up: {log_text[-2000:]}")
    save()
    return state


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def down(args: argparse.Namespace) -> None:
    down_dir(Path(args.dir))


def down_dir(base: Path, record: dict | None = None) -> None:
    """Tear down the hosts described by ``base/state.json`` (or, when that is gone, by
    the names a registry ``record`` implies)."""
    try:
        state = json.loads((base / "state.json").read_text())
    except (OSError, ValueError):
        if record is None:
            shutil.rmtree(base, ignore_errors=True)
            return
        prefix, count = record["prefix"], int(record.get("count", 2))
        state = {"namespaces": [f"{prefix}h{i}" for i in range(1, count + 1)],
                 "hosts": [{"veth": f"{prefix}v{i}"} for i in range(1, count + 1)],
                 "bridge": f"{prefix}br", "bridge_created": True, "prefix": prefix,
                 "iptables": ["FORWARD", "-i", f"{prefix}br", "-o", f"{prefix}br", "-j",
                              "ACCEPT"]}
    namespaces = state.get("namespaces", [])
    # everything still running in our namespaces (job processes, sshd sessions), then sshd
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _kill(pids_in_namespaces(namespaces) + state.get("sshd_pids", []), sig)
        deadline = time.monotonic() + 5
        while pids_in_namespaces(namespaces) and time.monotonic() < deadline:
            time.sleep(0.05)
    for pid in state.get("sshd_pids", []):  # reap if they are our children
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    # delete the veth pairs from this side: a namespace can outlive its processes for a
    # while (sockets still closing) and would keep its end, and so ours, alive
    for host in state.get("hosts", []):
        sh("ip", "link", "del", host["veth"], check=False)
    for ns in namespaces:
        sh("ip", "netns", "del", ns, check=False)
    if state.get("bridge_created"):
        sh("ip", "link", "del", state["bridge"], check=False)
    if state.get("iptables"):
        sh("iptables", "-D", *state["iptables"], check=False)
    for keep in state.get("keep_dirs", []):
        try:
            os.rmdir(keep)
        except OSError:
            pass
    if state.get("prefix"):
        (REGISTRY / f"{state['prefix']}.json").unlink(missing_ok=True)
    shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--dir", required=True)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--net", help="subnet (default: the first free 127.10.0.x/28)")
    parser.add_argument("--port", type=int, default=2222)
    parser.add_argument("--prefix", help="interface name prefix (default: fssh<k>-)")
    parser.add_argument("--owner", type=int, help="pid of the test session (default: parent)")
    parser.add_argument("--hide", action="append", default=[],
                        help="a directory bare hosts do not see (repeatable)")
    args = parser.parse_args()
    if args.action == "up":
        try:
            state = up(args)
        except subprocess.CalledProcessError as exc:
            down(args)
            sys.exit(f"{' '.join(exc.cmd)} failed: {exc.stderr.strip()}")
        except BaseException:
            down(args)
            raise
        print(json.dumps(state))
    else:
        down(args)


if __name__ == "__main__":
    main()
