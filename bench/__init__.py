"""fiber's benchmark suite: ``python -m bench run --quick|--full`` (see bench/README.md)."""
