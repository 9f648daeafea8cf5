"""Is this process running in a Docker container, and which one?

Used for the default image (a job runs in the image of its parent's container) and to
turn paths of this container into paths of the engine's machine (bind mounts name
paths on the engine's machine). With host networking the hostname is the host's, so
the container id is read from ``/proc/self/mountinfo``: Docker bind-mounts the
container's own ``hostname``, ``hosts`` and ``resolv.conf`` files from
``<data-root>/containers/<id>/``; without host networking the hostname (the short id)
is the fallback. The id is only a candidate: the backend asks the engine about it.
"""

from __future__ import annotations

import os
import re
import socket

_SHORT_ID = re.compile(r"[0-9a-f]{12}")
_MOUNTED_FILE = re.compile(r"/containers/([0-9a-f]{64})/(?:hostname|hosts|resolv\.conf)\s")


def own_container_id(mountinfo: str = "/proc/self/mountinfo",
                     dockerenv: str = "/.dockerenv") -> str | None:
    """The id of the Docker container this process runs in, or ``None``."""
    if not os.path.exists(dockerenv):
        return None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        text = ""
    match = _MOUNTED_FILE.search(text)
    if match:
        return match.group(1)
    # Without host networking Docker names the container's host after its short id.
    name = socket.gethostname()
    return name if _SHORT_ID.fullmatch(name) else None
