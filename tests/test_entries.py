"""Every Hydra command (``python -m src.<entry>``) composes the configuration from the one place every module reads
it from (:data:`src.io.paths.CONF_DIR`: the checkout's ``conf/``, the installed package's ``src/conf``, or
``RAIM_CONF_DIR``), and answers a bad override with the one line of :func:`src.core.errors.checked_overrides`."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from test_cli_errors import cli

ROOT = Path(__file__).resolve().parents[1]
# every module that declares a Hydra app, found from the source so that a new command is checked too
ENTRIES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__main__")
    for p in (ROOT / "src").rglob("*.py")
    if re.search(r"hydra\.main\(", p.read_text(encoding="utf-8")) and "__pycache__" not in p.parts
)
pytestmark = pytest.mark.slow


def test_the_entries_are_found():
    assert {"src.run", "src.analyses", "src.rate", "src.injection", "src.prevalence", "src.report"} <= set(ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_entry_composes_the_configuration_named_by_raim_conf_dir(tmp_path, entry):
    """An installed package has no ``conf/`` beside ``src/``: a config path written relative to the module would
    find nothing there, and would ignore ``RAIM_CONF_DIR``."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    text = (conf / "config.yaml").read_text()
    (conf / "config.yaml").write_text(text.replace("\noutput: results/results.json\n", "\noutput: elsewhere.json\n"))
    p = cli(tmp_path, entry, "--cfg", "job", env={"RAIM_CONF_DIR": str(conf)})
    assert p.returncode == 0 and "\noutput: elsewhere.json\n" in p.stdout, (entry, p.stderr[-2000:])


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_entry_answers_a_sweep_without_multirun_in_one_line(tmp_path, entry):
    p = cli(tmp_path, entry, "seed=1,2")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (entry, p.stderr[-2000:])
    assert lines[0].startswith("error: override 'seed=1,2': a ',' makes the value a list of values to sweep")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e != "src.rate"])  # src.rate's --help: its own commands
def test_an_entrys_help_names_the_groups_not_the_whole_config(tmp_path, entry):
    p = cli(tmp_path, entry, "--help")
    assert p.returncode == 0 and "roster: " in p.stdout and "stacker: logreg" in p.stdout, p.stdout[-2000:]
    assert len(p.stdout.splitlines()) < 40, len(p.stdout.splitlines())
