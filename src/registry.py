"""``python -m src.registry``: the command line of :mod:`src.mlops.registry`."""

from src.mlops.registry import main

if __name__ == "__main__":
    raise SystemExit(main())
