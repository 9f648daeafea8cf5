"""Where the managers' names live (as multiprocessing splits them), the check of the
standard library's internals they rely on, and what importing fiber.managers loads."""

from __future__ import annotations

import multiprocessing.managers
import subprocess
import sys

import pytest

import fiber
from fiber import managers, sharedctypes, synchronize
from fiber.runtime.managers import stdlib


@pytest.mark.parametrize("name", synchronize.__all__)
def test_primitives_come_from_fiber_synchronize(name):
    assert getattr(fiber, name) is getattr(synchronize, name)


@pytest.mark.parametrize("name", sharedctypes.__all__)
def test_values_come_from_fiber_sharedctypes(name):
    assert getattr(fiber, name) is getattr(sharedctypes, name)


def test_managers_keeps_only_its_own_names():
    assert fiber.Manager is managers.Manager
    for name in (*synchronize.__all__, *sharedctypes.__all__):
        # multiprocessing.managers has Value and Array: its server-side types, not these
        assert getattr(managers, name, None) is not getattr(fiber, name)


def test_the_standard_library_has_every_name_taken():
    stdlib._check()  # the Python running the tests


def test_a_missing_standard_name_is_named(monkeypatch):
    monkeypatch.delattr(multiprocessing.managers.BaseProxy, "_address_to_local")
    with pytest.raises(ImportError, match=r"multiprocessing\.managers\.BaseProxy\."
                                          r"_address_to_local"):
        stdlib._check()


def test_importing_managers_loads_no_process_or_pipe():
    """fiber.managers loads fiber's processes and pipes only when a server starts."""
    code = ("import sys, fiber.managers, fiber.synchronize, fiber.sharedctypes; "
            "print(sorted(m for m in ('fiber.process', 'fiber.connection') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"
