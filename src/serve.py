"""``python -m src.serve``: the command line of :mod:`src.mlops.serving`."""

from src.mlops.serving import main

if __name__ == "__main__":
    raise SystemExit(main())
