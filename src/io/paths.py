"""Where RAIM's files are: its configuration (``conf/``) and the project folder that the configs' relative
paths (``datasets/``, ``verdicts/``, ``mlflow.db``, ``params.yaml``) are read against.

* A source checkout: the repository, i.e. the folder that holds ``conf/config.yaml`` beside ``src/``.
* An installed package (``pip install .``): ``conf/`` ships inside the package (``src/conf``) and the project
  folder is the current directory.

``RAIM_CONF_DIR`` and ``RAIM_ROOT`` override either. Every module reads these paths from here, never from its
own ``__file__``.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/


def _checkout() -> Path | None:
    """The repository holding this package, when RAIM runs from a source checkout."""
    root = PACKAGE_DIR.parent
    return root if (root / "conf" / "config.yaml").is_file() and (root / "src").is_dir() else None


CHECKOUT = _checkout()
ROOT = Path(os.environ.get("RAIM_ROOT") or CHECKOUT or Path.cwd()).resolve()
CONF_DIR = Path(os.environ.get("RAIM_CONF_DIR") or (CHECKOUT / "conf" if CHECKOUT else PACKAGE_DIR / "conf")).resolve()


def conf_group(group: str) -> Path:
    """The folder of one config group, e.g. ``conf/frame``."""
    return CONF_DIR / group
