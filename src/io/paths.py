"""Where RAIM's files are: its configuration (``conf/``) and the project folder that the configs' relative
paths (``datasets/``, ``verdicts/``, ``mlflow.db``, ``params.yaml``) are read against.

* A source checkout: the repository, i.e. the folder that holds ``conf/config.yaml`` beside ``src/``.
* An installed package (``pip install .``): ``conf/`` ships inside the package (``src/conf``) and the project
  folder is the current directory.

``RAIM_CONF_DIR`` and ``RAIM_ROOT`` override either. Every module reads these paths from here, never from its
own ``__file__``.
"""

from __future__ import annotations

import hashlib
import os
import re
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


DEFAULT_DATASET = "items"  # the verdict-cache folder of items that name no dataset
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
CACHE_README = """# Verdicts of dataset {name}

One folder per judge: `<member>/<identity>.jsonl`, one verdict record a line, appended as each verdict is
computed (`python -m src.judges --datasets {name} --compute`), and `<identity>.identity.json` naming the judge.
This dataset's `verdicts` stage depends on this folder alone. Layout and record fields: verdicts/README.md.
"""


def dataset_folder(dataset: object) -> str:
    """The folder of a dataset's verdicts under a verdict-cache root (:mod:`src.judges.cache`): the dataset's
    name when it is a plain file name (a spec's always is), else a digest of it (a served item's free-text
    ``dataset``); no name: ``items``."""
    name = "" if dataset is None else str(dataset)
    if not name:
        return DEFAULT_DATASET
    if _PLAIN_NAME.fullmatch(name):
        return name
    return "ds-" + hashlib.sha256(name.encode()).hexdigest()[:16]


def dataset_cache_folder(cache_dir: str | Path, name: str) -> Path:
    """A dataset's folder of the verdict cache, made with its README when absent: the folder each DVC
    ``verdicts`` stage depends on exists once the set is built, judged or not."""
    folder = Path(cache_dir) / dataset_folder(name)
    readme = folder / "README.md"
    if not readme.exists():
        folder.mkdir(parents=True, exist_ok=True)
        readme.write_text(CACHE_README.format(name=name), encoding="utf-8")
    return folder
