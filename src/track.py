"""``python -m src.track params [override …]``: regenerate params.yaml from conf/ (:mod:`src.io.config`), with
any secret an override gives as a value redacted (:func:`src.mlops.redact.without_literal_secrets`)."""

import sys

from src.io.config import params_main
from src.io.trust import check_sources
from src.mlops import redact
from src.studies.checked import check_config


def main(argv: list[str] | None = None) -> int:
    """Regenerate params.yaml, every file the composition reads checked as data first
    (:func:`src.io.trust.check_sources`) and the composition checked as every command checks it
    (:func:`src.studies.checked.check_config`) before it is written; the overrides' secret values are known
    secrets of this process."""
    argv = sys.argv[1:] if argv is None else argv
    redact.add_secrets(redact.override_secrets(argv))
    return params_main(argv, clean=redact.without_literal_secrets, check=check_sources, verify=check_config)


if __name__ == "__main__":
    raise SystemExit(main())
