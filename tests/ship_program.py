"""The program the shipping tests run (issue #38): a main script with a module next to
it (``from mylib import step``) and a dependency, ``shipdep``, from a wheel the tests
build by hand (:func:`make_wheel`). It prints one JSON line: the results, where each
task's modules came from, and the archives its process sent whole
(``fiber.runtime.ship.serving.sent``)."""

from __future__ import annotations

import zipfile
from pathlib import Path

MAIN = '''
import json, os, socket, sys, time
import fiber
from fiber.runtime.ship import serving
from mylib import step
import shipdep


def task(x):
    return step(shipdep.scale(x))


def where(_):
    import fiber as f, mylib
    return {"fiber": f.__file__, "mylib": mylib.__file__, "shipdep": shipdep.__file__,
            "python": sys.executable, "cwd": os.getcwd(), "host": socket.gethostname()}


if __name__ == "__main__":
    settings = json.loads(os.environ["SHIP_TEST_SETTINGS"])
    fiber.init(**settings)
    report = {}
    t0 = time.monotonic()
    try:
        workers = int(os.environ.get("SHIP_TEST_WORKERS", "2"))
        with fiber.Pool(workers) as pool:
            # every worker up (each host's fetch done) before the tasks, so the count
            # of transfers does not depend on which workers the tasks reach first
            deadline = time.monotonic() + 120
            while os.environ.get("SHIP_TEST_WAIT") and time.monotonic() < deadline:
                stats = pool.stats()
                if stats.idle + stats.busy == workers or stats.lost:
                    break
                time.sleep(0.05)
            report["results"] = pool.map(task, range(8))
            report["where"] = pool.map(where, range(8), chunksize=1)
    except Exception as exc:
        report["error"] = {"type": type(exc).__name__, "message": str(exc),
                           "reason": getattr(exc, "reason", None)}
    report["elapsed"] = time.monotonic() - t0
    report["sent"] = serving.sent()
    print(json.dumps(report))
'''


def make_wheel(directory: Path) -> Path:
    """A wheel of the distribution ``shipdep`` 1.0 (one module), made by hand."""
    path = directory / "shipdep-1.0-py3-none-any.whl"
    files = {
        "shipdep/__init__.py": "def scale(x):\n    return x * 10\n",
        "shipdep-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: shipdep\nVersion: 1.0\n",
        "shipdep-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                       "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "shipdep-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("shipdep-1.0.dist-info/RECORD", record)
    return path
