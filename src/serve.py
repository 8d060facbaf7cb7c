"""``python -m src.serve``: the command line of :mod:`src.mlops.server`."""

from src.mlops.server import main

if __name__ == "__main__":
    raise SystemExit(main())
