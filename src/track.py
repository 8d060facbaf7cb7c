"""``python -m src.track params [override …]``: regenerate params.yaml from conf/ (:mod:`src.io.config`)."""

from src.io.config import params_main

if __name__ == "__main__":
    raise SystemExit(params_main())
