"""``python -m src.data``: the command line of :mod:`src.io.datasets`."""

from src.io.datasets import main

if __name__ == "__main__":
    raise SystemExit(main())
