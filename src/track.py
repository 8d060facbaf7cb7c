"""``python -m src.track params [override …]``: regenerate params.yaml from conf/ (:mod:`src.io.config`)."""

from src.io.config import params_main
from src.mlops import redact  # noqa: F401  (registers the secret scrubber of the one-line errors)

if __name__ == "__main__":
    raise SystemExit(params_main())
