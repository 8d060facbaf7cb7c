"""A user's own options in conf/ never break the project's tests: the fast suite runs in a copy of the checkout with
a benchmark written exactly as docs/own-benchmark.md says (``conf/dataset/newbench.yaml``) and an option of the
user's own in every other group (a roster, a stacker with C=0.5, a frame, analysis and suite settings, …)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import shipped_files

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def own_benchmark_spec() -> str:
    """The YAML block of docs/own-benchmark.md's step 2, as a user copies it."""
    text = (ROOT / "docs" / "own-benchmark.md").read_text(encoding="utf-8")
    block = re.search(r"\n( *)```yaml\n(.*?)\n\1```", text, re.S)
    assert block, "docs/own-benchmark.md has no YAML block"
    return "\n".join(line.removeprefix(block.group(1)) for line in block.group(2).splitlines()) + "\n"


def user_options(conf: Path) -> dict[str, str]:
    """One option of the user's own per conf/ group: ``mine`` (newbench for a dataset), a copy of a shipped option
    with its ``name`` (roster, frame) or a value (the stacker's C) changed."""
    out = {"dataset/newbench.yaml": own_benchmark_spec()}
    model = {"frame": "def_on", "roster": "tiny", "stacker": "logreg"}  # else the group's first option
    for group in sorted(p for p in conf.iterdir() if p.is_dir() and p.name != "dataset"):
        source = group / f"{model[group.name]}.yaml" if group.name in model else sorted(group.glob("*.yaml"))[0]
        text = source.read_text(encoding="utf-8")
        text = re.sub(r"(?m)^name: .*$", "name: mine", text)
        text = re.sub(r"(?m)^C: .*$", "C: 0.5", text)
        out[f"{group.name}/mine.yaml"] = text
    return out


def copy_checkout(dest: Path) -> None:
    """The checkout's tracked files (as they are in the working tree) in a new git repository: what the project
    ships is committed there, a user's additions are not."""
    for path in shipped_files("."):
        target = dest / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            target.symlink_to(os.readlink(path))
        elif path.is_file():
            shutil.copy2(path, target)
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        subprocess.run(["git", *cmd], cwd=dest, check=True, capture_output=True)


def test_the_fast_suite_passes_with_a_users_own_options_in_every_conf_group(tmp_path):
    repo = tmp_path / "repo"
    copy_checkout(repo)
    added = user_options(repo / "conf")
    for rel, text in added.items():
        (repo / "conf" / rel).write_text(text, encoding="utf-8")
    assert {"dataset/newbench.yaml", "roster/mine.yaml", "stacker/mine.yaml", "frame/mine.yaml"} <= set(added)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MLFLOW_", "RAIM_"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
