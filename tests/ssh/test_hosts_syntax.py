"""Parsing of host entries (pure functions: no SSH involved, nothing faked)."""

from __future__ import annotations

import pytest

from fiber_ssh.hosts import HostSyntaxError, parse_entry, resolve_hosts


@pytest.mark.parametrize("text, expected", [
    ("node1", dict(user=None, host="node1", port=None, slots=None, name="node1")),
    ("alice@node1:2222*8", dict(user="alice", host="node1", port=2222, slots=8,
                                name="alice@node1:2222")),
    ("[::1]:22*2", dict(user=None, host="::1", port=22, slots=2, name="[::1]:22")),
    ("bob@10.0.0.7*3", dict(user="bob", host="10.0.0.7", port=None, slots=3,
                            name="bob@10.0.0.7")),
])
def test_entries(text, expected):
    assert parse_entry(text) == expected


@pytest.mark.parametrize("text", ["", "@h", "h:", "h:x", "h*", "h*0", "h:0", "h:70000", "a b"])
def test_bad_entries(text):
    with pytest.raises(HostSyntaxError, match="SSH host"):
        parse_entry(text)


def test_defaults_and_duplicates():
    hosts = resolve_hosts({"ssh_hosts": ["h1", "carol@h1:22", "h2:2200*4"], "ssh_user": "carol",
                           "ssh_config_file": None})
    assert [(h.hostname, h.port, h.user, h.slots) for h in hosts] == [
        ("h1", 22, "carol", None), ("h2", 2200, "carol", 4)]
