"""The job's side, in fiber's bootstrap: the parent's preparation data (what
multiprocessing's spawn sends: ``sys.path``, the main script, the working directory)
with the parent's paths replaced by where the shipped files are on this host.

The stub (:mod:`fiber.runtime.ship.stub`) leaves in ``_FIBER_SHIPPED`` which
directory of the host's cache each of the parent's roots is, and the working
directory it chose. A path of the parent under a root becomes the same path under its
directory here; the parent's other ``sys.path`` entries (its standard library, its
site-packages) are not the job's: the job keeps its own, which the stub ordered
(code, standard library, shipped packages, the host's site-packages).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

__all__ = ["SHIPPED_ENV", "localize"]

SHIPPED_ENV = "_FIBER_SHIPPED"


def _mapper(mapping: dict[str, str]) -> Any:
    roots = sorted(mapping, key=len, reverse=True)

    def place(path: str) -> str | None:
        for root in roots:
            if path == root:
                return mapping[root]
            if path.startswith(root.rstrip(os.sep) + os.sep):
                return os.path.join(mapping[root], os.path.relpath(path, root))
        return None

    return place


def localize(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` for this host, when this job was shipped (else as it is)."""
    text = os.environ.pop(SHIPPED_ENV, None)
    if not text:
        return data
    shipped = json.loads(text)
    place = _mapper(shipped["map"])
    data = dict(data)
    ours = [p for p in (place(p) for p in data.get("sys_path", [])) if p]
    data["sys_path"] = ours + [p for p in sys.path if p not in ours]
    for name in ("dir", "orig_dir"):
        if name in data:
            data[name] = place(data[name]) or shipped["cwd"]
    main = data.get("init_main_from_path")
    if main:
        here = place(main)
        if here:
            data["init_main_from_path"] = here
        else:
            data.pop("init_main_from_path")
    return data
