"""Where the managers' names live (as multiprocessing splits them), the check of the
standard library's internals they rely on, and what importing fiber.managers loads."""

from __future__ import annotations

import multiprocessing.managers
import os
import subprocess
import sys

import pytest

import fiber
import fiber.context
from fiber import managers, sharedctypes, synchronize
from fiber.runtime.managers import stdlib


def _of_default_context(face):
    """``face`` is the default context's method of its name (as multiprocessing's
    module functions are)."""
    # the default context is the object fiber.context.get_context is a method of
    return (face.__self__ is fiber.context.get_context.__self__
            and face.__func__ is getattr(fiber.context.BaseContext, face.__name__))


@pytest.mark.parametrize("name", synchronize.__all__)
def test_primitives_come_from_fiber_synchronize(name):
    face = getattr(fiber, name)
    assert _of_default_context(face)
    made = face(2) if name == "Barrier" else face()
    assert type(made) is getattr(synchronize, name)


@pytest.mark.parametrize("name", ["Value", "Array", "RawValue", "RawArray"])
def test_values_come_from_fiber_sharedctypes(name):
    face = getattr(fiber, name)
    assert _of_default_context(face)
    assert type(face("i", 3)) is type(getattr(sharedctypes, name)("i", 3))


def test_managers_keeps_only_its_own_names():
    assert _of_default_context(fiber.Manager)
    assert "Manager" in managers.__all__  # what the context's Manager() calls
    for module in (synchronize, sharedctypes):
        for name in module.__all__:
            # multiprocessing.managers has Value and Array: its server-side types, not
            # these
            assert getattr(managers, name, None) is not getattr(module, name)


def test_the_standard_library_has_every_name_taken():
    # private: the check fiber makes when it imports multiprocessing.managers' internals, called
    # directly
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


def test_every_proxy_class_unpickles_in_a_process_without_managers():
    """A job that imported nothing of fiber's managers finds every proxy class a
    SyncManager's proxy pickles by reference."""
    import pickle

    # BaseManager._registry is multiprocessing's own (the registered typeids and proxies)
    classes = {entry[-1] for entry in managers.SyncManager._registry.values()
               if isinstance(entry[-1], type)}
    code = ("import pickle, sys; classes = pickle.loads(sys.stdin.buffer.read()); "
            "print(len(classes), 'fiber.managers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(classes),
                         capture_output=True, timeout=120, check=True).stdout
    assert out.decode().split() == [str(len(classes)), "False"]
    assert len(classes) > 5


_PROGRAM = '''
import fiber


def fill(shared):
    shared.append(42)


if __name__ == "__main__":
    manager = fiber.Manager()
    shared = manager.list()
    p = fiber.Process(target=fill, args=(shared,))
    p.start()
    p.join(120)
    print(p.exitcode, list(shared))
    manager.shutdown()
'''


def test_proxy_reaches_a_new_interpreter_whose_main_imports_only_fiber(tmp_path):
    """Jobs started as new interpreters (as on every backend but the local fork
    server) unpickle a list proxy though their main module imports only fiber."""
    script = tmp_path / "prog.py"
    script.write_text(_PROGRAM)
    env = {**os.environ, "FIBER_LOCAL_START_METHOD": "spawn", "FIBER_BACKEND": "local"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0", "[42]"], proc.stderr[-3000:]
