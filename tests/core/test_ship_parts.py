"""The parts of shipping (issue #38), each on its own: the stub speaks fiber's wire
byte for byte (against a real hub of this process), a stranger gets nothing from the
ship channel, archives are named by their files, what a directory leaves out, the
host cache's eviction, and the bootstrap's mapping of the parent's paths."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys

import pytest

from fiber.runtime.ship import archive, code, localize, serving, stub
from fiber.wire import auth, protocol, transport
from fiber.wire.protocol import Control


def test_the_stub_uses_the_wires_bytes():
    assert stub.FRAME.format == protocol.STREAM_FRAME.format
    assert stub.CHANNEL.format == protocol.CHANNEL.format
    assert (stub.MSG, stub.AUTH1, stub.AUTH3, stub.OK) == (
        protocol.MSG, protocol.AUTH1, protocol.AUTH3, protocol.OK)
    assert (stub.HUB_ROLE, stub.CLIENT_ROLE, stub.NONCE_SIZE) == (
        protocol.HUB_ROLE, protocol.CLIENT_ROLE, protocol.NONCE_SIZE)
    assert stub.SHIPPING == Control.SHIPPING
    assert (stub.INFO, stub.READ) == (serving.INFO, serving.READ)
    assert stub.OFFSET.format == serving.OFFSET.format
    assert stub.SHIPPED_ENV == localize.SHIPPED_ENV


@pytest.fixture
def offered(tmp_path, monkeypatch):
    """A hub of this process whose ship channel offers one archive."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("A = 1\n")
    made = archive.build("code", [("src/a.py", str(tmp_path / "src" / "a.py"))], 1 << 20)
    hub = transport.get_hub("127.0.0.1")
    channel = serving.ShipChannel()
    channel.offer(made)
    cid = hub.add_channel(channel, stream=True)
    yield hub, cid, made
    hub.remove_channel(cid)
    channel.close()


def test_the_stub_fetches_an_archive_from_a_hub(offered, tmp_path):
    hub, cid, made = offered
    link = stub.Link(hub.stream_address, auth.get_authkey())
    try:
        cache = stub.Cache(str(tmp_path / "cache"), 1 << 30)
        before = serving.sent().get(made.key, 0)
        where = cache.ensure(link, cid, {"key": made.key, "kind": "code",
                                         "unpacked": made.unpacked})
        assert open(os.path.join(where, "src", "a.py")).read() == "A = 1\n"
        assert serving.sent()[made.key] == before + 1
        # a second job of the host finds it: nothing is sent
        again = stub.Cache(str(tmp_path / "cache"), 1 << 30)
        assert again.ensure(link, cid, {"key": made.key, "kind": "code",
                                        "unpacked": made.unpacked}) == where
        assert serving.sent()[made.key] == before + 1
        with pytest.raises(OSError, match="does not ship"):
            link.request(cid, stub.INFO + b"0" * 64)
    finally:
        link.close()


def test_a_stranger_gets_nothing(offered):
    hub, cid, made = offered
    with pytest.raises(OSError):
        stub.Link(hub.stream_address, b"\1" * 32)


def _files(tmp_path, content: bytes) -> list[tuple[str, str]]:
    path = tmp_path / "f.bin"
    path.write_bytes(content)
    return [("d/f.bin", str(path))]


def test_an_archive_is_named_by_its_files(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    one = archive.build("code", _files(tmp_path, b"x"), 1 << 20)
    same = archive.build("code", _files(tmp_path, b"x"), 1 << 20)
    other = archive.build("code", _files(tmp_path, b"y"), 1 << 20)
    assert one.key == same.key and one.sha256 == same.sha256
    assert other.key != one.key
    assert os.stat(one.path).st_mode & 0o777 == 0o644
    assert os.stat(os.path.dirname(one.path)).st_mode & 0o777 == 0o700


def test_what_a_directory_leaves_out(tmp_path):
    root = tmp_path / "proj"
    for rel in ["main.py", "pkg/__init__.py", "pkg/mod.py", ".git/config",
                "pkg/__pycache__/mod.cpython-311.pyc", "venv/pyvenv.cfg", "venv/lib/x.py",
                "out.log", "build/x.py", "docs/keep.log", "deep/a/b/tmp.txt", "mod.pyc"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    (root / ".gitignore").write_text("*.log\n/build/\n**/b/*.txt\n")
    (root / "docs" / ".gitignore").write_text("!keep.log\n")
    (root / "linked").symlink_to(root / "pkg")
    found = [rel for rel, _ in code.walk(code.Root(str(root)))]
    assert found == [".gitignore", "docs/.gitignore", "docs/keep.log", "main.py",
                     "pkg/__init__.py", "pkg/mod.py"]
    only = [rel for rel, _ in code.walk(code.Root(str(root), {"pkg"}))]
    assert only == ["pkg/__init__.py", "pkg/mod.py"]


def test_the_cache_evicts_the_oldest_entries_no_job_holds(tmp_path):
    cache = stub.Cache(str(tmp_path / "c"), limit=250)
    keys = [f"{i:064x}" for i in range(4)]
    for age, key in enumerate(keys):
        os.mkdir(os.path.join(cache.root, key))
        with open(os.path.join(cache.root, key, stub.ENTRY_INFO), "w") as f:
            json.dump({"key": key, "size": 100}, f)
        lock = os.path.join(cache.root, key + ".lock")
        open(lock, "w").close()
        os.utime(lock, (1000 + age, 1000 + age))
    held = os.open(os.path.join(cache.root, keys[0] + ".lock"), os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_SH)  # the oldest is in use by a job
    try:
        cache.evict()
    finally:
        os.close(held)
    left = sorted(n for n in os.listdir(cache.root) if len(n) == 64)
    assert left == [keys[0], keys[3]]


def test_a_cache_open_to_others_is_refused(tmp_path):
    path = tmp_path / "open"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    with pytest.raises(stub.Refused, match="lets other users in"):
        stub.Cache(str(path), 1)


def test_the_bootstrap_maps_the_parents_paths(monkeypatch):
    monkeypatch.setenv(localize.SHIPPED_ENV, json.dumps(
        {"map": {"/home/me/proj": "/cache/k/proj"}, "cwd": "/cache/k/proj"}))
    data = {"sys_path": ["/home/me/proj", "/home/me/proj/lib", "/usr/lib/python3.11",
                         "/home/me/.venv/lib/python3.11/site-packages"],
            "dir": "/home/me/proj/sub", "orig_dir": "/elsewhere",
            "init_main_from_path": "/home/me/proj/main.py"}
    out = localize.localize(data)
    assert out["sys_path"][:2] == ["/cache/k/proj", "/cache/k/proj/lib"]
    assert "/home/me/.venv/lib/python3.11/site-packages" not in out["sys_path"]
    assert out["sys_path"][2:] == [p for p in sys.path if p not in out["sys_path"][:2]]
    assert out["dir"] == "/cache/k/proj/sub" and out["orig_dir"] == "/cache/k/proj"
    assert out["init_main_from_path"] == "/cache/k/proj/main.py"
    assert localize.SHIPPED_ENV not in os.environ


def test_what_a_killed_fetch_left_is_never_used_and_is_swept(offered, tmp_path):
    """A job killed while it unpacked leaves ``.partial-*`` (named with its pid): the
    next job fetches the entry whole, and the leftovers of a dead process are removed."""
    hub, cid, made = offered
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    partial = cache_dir / f".partial-{made.key[:16]}-{dead.pid}-abcd"
    (partial / "src").mkdir(parents=True)
    (partial / "src" / "a.py").write_text("A = 'half'\n")
    (cache_dir / f".partial-{made.key[:16]}-{dead.pid}-abcd.tgz").write_bytes(b"\x1f")
    alive = cache_dir / f".partial-{made.key[:16]}-{os.getpid()}-beef"
    alive.mkdir()
    link = stub.Link(hub.stream_address, auth.get_authkey())
    try:
        where = stub.Cache(str(cache_dir), 1 << 30).ensure(
            link, cid, {"key": made.key, "kind": "code", "unpacked": made.unpacked})
    finally:
        link.close()
    assert open(os.path.join(where, "src", "a.py")).read() == "A = 1\n"
    assert sorted(p.name for p in cache_dir.iterdir() if p.name.startswith(".")) \
        == [alive.name], "the dead job's leftovers were not swept (or the live one was)"


def test_a_disk_that_fills_during_the_unpack_leaves_nothing(tmp_path, monkeypatch):
    """The cache on a tmpfs of 1 MiB and an archive of 8 MiB of zeros (a few KiB
    compressed). The archive's announced unpacked size is given as 0, as if the disk
    had room when the job checked and filled while it unpacked (another process
    writing): the unpack itself meets ENOSPC."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root, to mount a small tmpfs")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "zeros.bin").write_bytes(b"\0" * (8 << 20))
    made = archive.build("code", [("zeros.bin", str(tmp_path / "zeros.bin"))], 16 << 20)
    assert made.size < 256 << 10
    hub = transport.get_hub("127.0.0.1")
    channel = serving.ShipChannel()
    channel.offer(made)
    cid = hub.add_channel(channel, stream=True)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs",
                              str(cache_dir)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    link = stub.Link(hub.stream_address, auth.get_authkey())
    try:
        with pytest.raises(stub.Refused, match="is full"):
            stub.Cache(str(cache_dir), 1 << 30).ensure(
                link, cid, {"key": made.key, "kind": "code", "unpacked": 0})
        assert [p.name for p in cache_dir.iterdir()] == [made.key + ".lock"]
    finally:
        link.close()
        hub.remove_channel(cid)
        channel.close()
        subprocess.run(["umount", str(cache_dir)], check=True)
