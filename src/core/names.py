"""Names of logged metrics: MLflow accepts alphanumerics, ``_ - . /`` and spaces."""

from __future__ import annotations

import re

_BAD_NAME = re.compile(r"[^\w\-. /]")


def metric_name(*parts: str) -> str:
    """An MLflow-legal metric name (alphanumerics, ``_ - . /`` and spaces)."""
    return _BAD_NAME.sub("_", "/".join(str(p) for p in parts))
