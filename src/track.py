"""``python -m src.track``: the command line of :mod:`src.mlops.tracking`."""

from src.mlops.tracking import main

if __name__ == "__main__":
    raise SystemExit(main())
