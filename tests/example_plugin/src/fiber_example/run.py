"""The wrapper every example job runs in: ``python -m fiber_example.run JOBDIR ARGV...``.

It plays the part of a batch scheduler's job step: it runs the job's command as its
child, in the job's own process group, and writes the exit status (negative for a
signal, as multiprocessing reports it) to ``JOBDIR/exit`` when the command ends, so that
any process can read how the job ended. A SIGTERM sent to the group reaches the command
too; the wrapper outlives it to write its status. A SIGKILL ends both without a status:
the backend then knows the job was cancelled from the ``cancelled`` file it wrote first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    jobdir, command = argv[0], argv[1:]
    signal.signal(signal.SIGTERM, lambda *_: None)  # the command got it as well
    try:
        code = subprocess.call(command)
    except OSError as exc:  # not found, not executable: the job fails as a shell's would
        print(f"fiber-example: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        code = 127
    tmp = os.path.join(jobdir, "exit.tmp")
    with open(tmp, "w") as out:
        out.write(str(code))
    os.replace(tmp, os.path.join(jobdir, "exit"))  # readers see all of it or nothing
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
