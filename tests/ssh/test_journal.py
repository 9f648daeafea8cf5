"""A durable pool on the SSH backend (docs/durable.md): the master killed with SIGKILL
at 20 random points of a 10,000-task map whose workers are jobs on the real test hosts,
then run again with the same journal: the results equal a serial run's, no task ran more
than twice across both runs, and every job of the killed master ends by itself (nothing
but the hosts' sshds is left in their namespaces)."""

from __future__ import annotations

import sys
from pathlib import Path

from ssh_helpers import describe, leftovers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import journal_programs as programs  # noqa: E402


def test_kill_the_master_anywhere_and_rerun_on_ssh_hosts(ssh_hosts, tmp_path):
    def left_running(tag: str) -> list[str]:
        # (the hosts run only this test's jobs: the namespaces are the session's)
        return describe(leftovers(ssh_hosts))

    programs.kill_and_rerun(tmp_path, 20, {"FIBER_BACKEND": "ssh"}, left_running)
