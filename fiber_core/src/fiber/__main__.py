"""``python -m fiber``: the ``fiber`` command line (:mod:`fiber.cli`)."""

import sys

from fiber.cli import main

if __name__ == "__main__":
    sys.exit(main())
