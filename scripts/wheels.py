"""Build every package as a user would and run the quick start from the result (tox's
``wheels`` environment).

1. ``python -m build`` makes the sdist of fiber-core and of each plugin, and the wheel
   from that sdist (so both are checked), into one directory;
2. each package's files carry the version of its ``_version.py`` and the repository's
   LICENSE (Apache-2.0, in the metadata too);
3. a fresh ``python -m venv`` gets the wheels (their dependencies from the index), and
   from a directory outside the clone: ``fiber --version`` names every package,
   ``fiber backends`` lists every backend, ``import fiber`` comes from the venv and
   ``examples/pi.py`` (the README's quick start) estimates pi on the local backend.

Run it with a Python that has ``build`` installed: ``python scripts/wheels.py``.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# package directory -> (distribution, import package, backends it provides)
PACKAGES = {
    "fiber_core": ("fiber-core", "fiber", ["local"]),
    "plugins/fiber-docker": ("fiber-docker", "fiber_docker", ["docker"]),
    "plugins/fiber-ssh": ("fiber-ssh", "fiber_ssh", ["ssh"]),
    "plugins/fiber-slurm": ("fiber-slurm", "fiber_slurm", ["slurm"]),
    "plugins/fiber-k8s": ("fiber-k8s", "fiber_k8s", ["kubernetes"]),
}


def version_of(directory: str, module: str) -> str:
    """The ``__version__`` written in the package's ``_version.py``."""
    tree = ast.parse((ROOT / directory / "src" / module / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__version__":
            return str(ast.literal_eval(node.value))
    raise SystemExit(f"no __version__ in {directory}/src/{module}/_version.py")


def run(*command: str | Path, cwd: Path | None = None) -> str:
    print("+", " ".join(map(str, command)), flush=True)
    done = subprocess.run([str(c) for c in command], cwd=cwd, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(done.stdout)
        raise SystemExit(f"failed ({done.returncode}): {' '.join(map(str, command))}")
    return done.stdout


def check(condition: bool, message: str) -> None:
    if not condition:
        raise SystemExit(f"wheels check failed: {message}")


def check_license(dist: Path, stem: str) -> None:
    """The sdist and the wheel carry the repository's LICENSE (a package directory's
    LICENSE is a link to it) and say Apache-2.0 in their metadata."""
    license_text = (ROOT / "LICENSE").read_bytes()
    with tarfile.open(dist / f"{stem}.tar.gz") as sdist:
        member = sdist.extractfile(f"{stem}/LICENSE")
        check(member is not None and member.read() == license_text,
              f"{stem}.tar.gz has no LICENSE equal to the repository's")
    with zipfile.ZipFile(dist / f"{stem}-py3-none-any.whl") as wheel:
        check(wheel.read(f"{stem}.dist-info/licenses/LICENSE") == license_text,
              f"{stem}'s wheel has no LICENSE equal to the repository's")
        metadata = wheel.read(f"{stem}.dist-info/METADATA").decode()
        check("License-Expression: Apache-2.0" in metadata,
              f"{stem}'s wheel metadata does not say License-Expression: Apache-2.0")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="fiber-wheels-") as tmp:
        dist, venv, elsewhere = Path(tmp, "dist"), Path(tmp, "venv"), Path(tmp, "run")
        elsewhere.mkdir()
        expected = {}
        for directory, (name, module, _) in PACKAGES.items():
            # builds in a copy: the build leaves build/ and *.egg-info behind
            source = Path(tmp, "src", Path(directory).name)
            shutil.copytree(ROOT / directory, source,
                            ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
            run(sys.executable, "-m", "build", "--outdir", dist, source)
            version = version_of(directory, module)
            expected[name] = version
            stem = name.replace("-", "_") + "-" + version
            check((dist / f"{stem}.tar.gz").is_file(), f"no sdist {stem}.tar.gz")
            check((dist / f"{stem}-py3-none-any.whl").is_file(), f"no wheel {stem}-*.whl")
            check_license(dist, stem)

        run(sys.executable, "-m", "venv", venv)
        python, fiber = venv / "bin" / "python", venv / "bin" / "fiber"
        run(python, "-m", "pip", "install", "-q", "--find-links", dist,
            *sorted(dist.glob("*.whl")))

        where = run(python, "-c", "import fiber; print(fiber.__file__)", cwd=elsewhere)
        check(where.strip().startswith(str(venv)), f"fiber imported from {where.strip()}")
        versions = run(fiber, "--version", cwd=elsewhere).splitlines()
        print("\n".join(versions))
        for name, version in expected.items():
            check(any(line.startswith(f"{name} {version}") for line in versions),
                  f"fiber --version does not name {name} {version}")
        backends = run(fiber, "backends", cwd=elsewhere)
        for name, _, provided in PACKAGES.values():
            for backend in provided:
                check(re.search(rf"^{backend}\s+{name} ", backends, re.M) is not None,
                      f"fiber backends does not list {backend} from {name}")

        shutil.copy(ROOT / "examples" / "pi.py", elsewhere)
        output = run(python, "pi.py", "8", cwd=elsewhere)
        print(output, end="")
        check(re.search(r"^pi is about 3\.1\d* .*backend local", output, re.M) is not None,
              "examples/pi.py did not estimate pi")
    print("wheels: every package builds (sdist and wheel), installs and runs the quick start")


if __name__ == "__main__":
    main()
