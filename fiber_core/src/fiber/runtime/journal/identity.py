"""What makes two pieces of work of a durable pool the same: the identity of a task's
function (its qualified name and a hash of its code, and of the code of the functions
and classes of its own module that it names) and a hash of an item.

A journaled result is given back only when both match, so a function edited between
two runs of a program, or a map over other inputs, is computed again, never answered
from the journal by mistake. The hashes are conservative: an edit that changes nothing
a task computes (a renamed local, a moved line) may still count as a change, which costs
a recomputation, not a wrong answer.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import types
import weakref
from typing import Any

from fiber.wire import serialization

__all__ = ["function_identity", "item_hash"]

_DIGEST = 16
_cache: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def function_identity(func: Any) -> str:
    """``module.qualname:hash``, the hash covering ``func``'s code (or, for a callable
    that is not a Python function, its pickle) and what it names of its own module."""
    try:
        return _cache[func]
    except (KeyError, TypeError):
        pass
    digest = hashlib.blake2b(digest_size=_DIGEST)
    _feed(digest, func, set())
    target = getattr(func, "func", func)  # a partial's function names it
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    identity = f"{module}.{name}:{digest.hexdigest()}"
    try:
        _cache[func] = identity
    except TypeError:  # not weakly referable: computed again next time
        pass
    return identity


def item_hash(item: Any) -> bytes:
    """A hash of ``item``'s pickle (by pickle, else cloudpickle). Two items with the
    same value have the same hash as long as they pickle alike: a set of strings may
    pickle in another order in another run (string hashes are salted per process), and
    is then computed again."""
    return hashlib.blake2b(serialization.pickle_object(item), digest_size=_DIGEST).digest()


def _feed(digest: Any, obj: Any, seen: set[int]) -> None:
    """Add what decides ``obj``'s behaviour to ``digest`` (each object once)."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, functools.partial):
        digest.update(b"partial")
        _feed(digest, obj.func, seen)
        _feed_value(digest, (obj.args, obj.keywords))
    elif isinstance(obj, types.MethodType):
        digest.update(b"method")
        _feed(digest, obj.__func__, seen)
        _feed_value(digest, obj.__self__)
    elif isinstance(obj, types.FunctionType):
        digest.update(b"function")
        _feed_code(digest, obj.__code__)
        _feed_value(digest, (obj.__defaults__, obj.__kwdefaults__))
        for cell in obj.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            _feed_named(digest, contents, obj.__module__, seen)
        for name in sorted(_names(obj.__code__)):
            if name in obj.__globals__:
                _feed_named(digest, obj.__globals__[name], obj.__module__, seen)
    elif isinstance(obj, type):
        digest.update(b"class" + obj.__qualname__.encode())
        for attr, value in sorted(vars(obj).items()):
            if isinstance(value, (types.FunctionType, staticmethod, classmethod, property)):
                digest.update(attr.encode())
                for part in _functions_of(value):
                    _feed(digest, part, seen)
    else:
        _feed_value(digest, obj)


def _feed_named(digest: Any, value: Any, module: str, seen: set[int]) -> None:
    """A global or closure value a function names: functions and classes of the
    function's own module are followed (a helper it calls is part of what it does),
    plain data (numbers, strings, and small containers of them: a constant such as
    ``SCALE = 2``) counts by its value; anything else (a module, a large table, an
    object) counts by its name's presence only: the inputs that matter are the task's
    arguments."""
    if isinstance(value, (types.FunctionType, type)):
        if getattr(value, "__module__", None) == module:
            _feed(digest, value, seen)
    elif value is None or isinstance(value, _SCALARS):
        digest.update(repr(value).encode())
    elif isinstance(value, _CONTAINERS) and len(value) <= _SMALL and _plain(value):
        digest.update(repr(sorted(map(repr, value)) if isinstance(value, (set, frozenset))
                           else value).encode())


_SCALARS = (bool, int, float, complex, str, bytes)
_CONTAINERS = (tuple, list, dict, set, frozenset)
_SMALL = 256


def _plain(value: Any) -> bool:
    """Whether a small container holds only plain data (at any depth)."""
    items = list(value.items()) if isinstance(value, dict) else list(value)
    for item in items:
        parts = item if isinstance(value, dict) else (item,)
        for part in parts:
            if part is None or isinstance(part, _SCALARS):
                continue
            if isinstance(part, _CONTAINERS) and len(part) <= _SMALL and _plain(part):
                continue
            return False
    return True


def _functions_of(value: Any) -> list[Any]:
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    if isinstance(value, (staticmethod, classmethod)):
        return [value.__func__]
    return [value]


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _feed_code(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars,
                        code.co_argcount, code.co_kwonlyargcount)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed_code(digest, const)
        elif isinstance(const, frozenset):  # (``x in {"a", "b"}``: salted order)
            digest.update(repr(sorted(map(repr, const))).encode())
        else:
            digest.update(repr(const).encode())


def _feed_value(digest: Any, value: Any) -> None:
    try:
        digest.update(serialization.pickle_object(value))
    except (pickle.PicklingError, TypeError, ValueError, AttributeError) as exc:
        digest.update(f"unpicklable {type(value).__qualname__}: {exc}".encode())
    except Exception as exc:  # noqa: BLE001 - SerializationError and the like
        digest.update(f"unpicklable {type(value).__qualname__}: {type(exc).__name__}".encode())
