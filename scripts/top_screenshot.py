"""Draw docs/images/fiber-top.svg, the command-line page's screenshot of ``fiber top``:
a real program (a Pool of 4 local workers running a map of slow tasks, one of which
fails) is started, and the frame ``fiber top`` would show of it is rendered by
:func:`fiber.top.render` into an SVG with rich's ``Console(record=True)``.

``python scripts/top_screenshot.py`` in an environment with fiber-core[top] (the lint
tox env: ``.tox/lint/bin/python scripts/top_screenshot.py``); the program it starts is
ended before it returns."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "images" / "fiber-top.svg"

PROGRAM = textwrap.dedent("""
    import time
    import fiber

    def work(x):
        time.sleep(0.3 + (x % 7) * 0.1)
        if x == 5:
            raise ValueError(f"task {x} failed")
        return x

    if __name__ == "__main__":
        with fiber.Pool(4) as pool:
            results = pool.map_async(work, range(400), chunksize=1)
            time.sleep(120)
""")


def main() -> int:
    from rich.console import Console

    from fiber import top
    from fiber.runtime import status

    proc = subprocess.Popen([sys.executable, "-c", PROGRAM])
    try:
        deadline = time.monotonic() + 60
        while True:
            programs = [p for p in status.programs() if p.pid == proc.pid]
            if programs:
                snap = top._snapshot(programs[0])
                if snap["pools"] and snap["pools"][0]["tasks"]["done"] >= 20 \
                        and snap["pools"][0]["errors"]:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the program did not show a running pool within 60 s")
            time.sleep(0.5)
        console = Console(record=True, width=100, file=open("/dev/null", "w"))
        console.print(top.render(snap, []))
        OUT.parent.mkdir(parents=True, exist_ok=True)
        console.save_svg(str(OUT), title="fiber top")
    finally:
        proc.kill()
        proc.wait()
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
