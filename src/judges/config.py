"""The judges' configuration: a roster (conf/roster/<name>.yaml) and the judging frames (conf/frame/), composed
with Hydra's compose API."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from src.core.errors import RaimError
from src.io.paths import CONF_DIR
from src.judges.frames import is_frame_cfg


def load_roster(name: str):
    """A roster node by name, composed with Hydra's compose API from conf/roster/<name>.yaml."""
    path = CONF_DIR / "roster" / f"{name}.yaml"
    if not path.exists():
        avail = sorted(p.stem for p in (CONF_DIR / "roster").glob("*.yaml"))
        raise RaimError(f"no roster {name!r}; available: {avail}")
    with initialize_config_dir(config_dir=str(CONF_DIR / "roster"), version_base=None):
        return compose(config_name=name)


def load_frame_cfgs():
    """Every judging frame of conf/frame by name (selectors such as ``auto`` left out)."""
    out = {}
    with initialize_config_dir(config_dir=str(CONF_DIR / "frame"), version_base=None):
        for p in sorted((CONF_DIR / "frame").glob("*.yaml")):
            cfg = compose(config_name=p.stem)
            if is_frame_cfg(cfg):  # skip selectors such as `auto`
                out[p.stem] = cfg
    return out
