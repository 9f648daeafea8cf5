"""The version of fiber-k8s: the one place it is written (pyproject.toml reads it)."""

__version__ = "0.1.0"
