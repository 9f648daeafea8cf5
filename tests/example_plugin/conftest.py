"""The example backend's test cluster for fiber's backend suite: a fresh spool
directory for the session. ``pytest --fiber-backend example``, run in this folder (the
package's root, pytest's rootdir, so that fiber's suite sees this fixture), runs the
contract and the portable tests on it and checks that no job was left in the spool."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fiber_cluster(fiber_backend_name: str) -> Iterator[dict[str, str]]:
    spool = tempfile.mkdtemp(prefix="fiber-example-test-")
    yield {"FIBER_EXAMPLE_SPOOL": spool}
    leftovers = [p.name for p in Path(spool).iterdir()]
    shutil.rmtree(spool, ignore_errors=True)
    assert not leftovers, f"jobs left in the spool: {leftovers}"
