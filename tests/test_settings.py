"""Typed settings below the entries: each entry checks its composed config once, through the one checked path
(:func:`src.studies.checked.check_config`), into frozen settings objects (:mod:`src.io.settings`); no module below
the entries imports OmegaConf or names a ``DictConfig``, and an unknown key is still one line naming it."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from src.io.config import ConfigError
from src.io.settings import JudgeSettings, PathsSettings, Settings, TopLevel, TrackingSettings
from src.judges import tables
from src.studies.checked import check_config

ROOT = Path(__file__).resolve().parents[1]
CHECKED_PATH = ("src/io/config.py", "src/io/trust.py")
"""The one checked path: where a composed config is read (the allow-lists, the unknown-key refusal)."""
HYDRA = re.compile(r"DictConfig|omegaconf")


def is_entry(rel: str) -> bool:
    """An entry point: a ``python -m src.<x>`` module (``src/<x>.py``) or a package's ``__main__``."""
    parts = Path(rel).parts
    return (len(parts) == 2 and parts[0] == "src") or parts[-1] == "__main__.py"


def hydra_config_readers(src: Path) -> list[str]:
    """The modules under ``src`` that name a ``DictConfig`` or import OmegaConf, other than the entries and the
    checked path (``grep -rn "DictConfig\\|omegaconf" src/``)."""
    out = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).as_posix()
        if is_entry(rel) or rel in CHECKED_PATH:
            continue
        if HYDRA.search(path.read_text(encoding="utf-8")):
            out.append(rel)
    return out


def test_below_the_entries_no_module_sees_the_hydra_config():
    assert hydra_config_readers(ROOT / "src") == []


def test_the_rule_finds_a_module_that_takes_the_hydra_config(tmp_path):
    """The rule is not vacuous: a library module taking a ``DictConfig`` is named; an entry doing so is not."""
    (tmp_path / "src" / "studies").mkdir(parents=True)
    (tmp_path / "src" / "studies" / "study.py").write_text("from omegaconf import DictConfig\n")
    (tmp_path / "src" / "noise.py").write_text("from omegaconf import DictConfig\n")
    (tmp_path / "src" / "io").mkdir()
    (tmp_path / "src" / "io" / "config.py").write_text("from omegaconf import OmegaConf\n")
    assert hydra_config_readers(tmp_path / "src") == ["src/studies/study.py"]


@pytest.fixture(scope="module")
def settings() -> Settings:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return check_config(compose(config_name="config"))


def test_the_settings_are_typed_and_frozen(settings):
    assert isinstance(settings.paths, PathsSettings) and isinstance(settings.judge, JudgeSettings)
    assert isinstance(settings.tracking, TrackingSettings) and isinstance(settings.top, TopLevel)
    for obj, field in (
        (settings, "paths"),
        (settings.top, "verdicts"),
        (settings.paths, "cache_dir"),
        (settings.judge, "compute"),
        (settings.judge.ray, "batch_size"),
        (settings.tracking, "uri"),
        (settings.suite, "seed"),
        (settings.noise, "rates"),
        (settings.monitor.replay, "seed"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)
    # the nodes its own reader checks (a roster, a frame) are read-only all the way down
    with pytest.raises(TypeError):
        settings.roster["name"] = "other"  # type: ignore[index]
    with pytest.raises(TypeError):
        settings.roster["members"][0]["name"] = "other"  # type: ignore[index]
    assert isinstance(settings.roster["members"], tuple)
    node = settings.node("stacker")  # a plain copy to write or hand on: changing it changes nothing
    node["C"] = -1
    assert settings.stacker["C"] != -1


def test_a_function_below_the_entries_reads_the_settings(settings):
    """The verdict table from the settings alone: the roster's cache under ``paths``, ``judge.per_dataset``."""
    table = tables.load_table(settings)
    assert table.source == f"cache {settings.paths.cache_dir} (roster {settings.roster['name']})"
    assert set(table.datasets) == set(settings.dataset["datasets"])


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("+paths.remote=x", r"unknown key 'remote' for PathsSettings"),
        ("+judge.ray.adress=auto", r"unknown key 'adress' for RaySettings .*did you mean 'address'"),
        ("+noise.ratez=[0.1]", r"unknown key 'ratez' for NoiseSettings .*did you mean 'rates'"),
        ("+tracking.token=t", r"unknown key 'token' for TrackingSettings"),
        ("+extra=1", r"unknown key 'extra' for TopLevel"),
    ],
)
def test_building_the_settings_refuses_an_unknown_key_naming_it(override, line):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[override])
    with pytest.raises(ConfigError, match=line):
        check_config(cfg)


def test_an_entry_refuses_an_unknown_key_in_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "src.report", "+paths.remote=x"],
        cwd=ROOT,
        env={**os.environ, "RAIM_HYDRA_DIR": str(tmp_path / "hydra")},  # its run folder stays out of the checkout
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "unknown key 'remote' for PathsSettings" in lines[0]
