"""Where each DVC output is kept (docs/pipeline.md, "in git?"): an output DVC does not cache (``cache: false``) is
committed to git, so a clone has it; every other output is in DVC's cache and ignored by git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _outputs() -> list[tuple[str, bool]]:
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        return sorted({(str(Path(o.fs_path).relative_to(ROOT)), bool(o.use_cache)) for o in repo.index.outs})


def _ignored(paths: list[str]) -> set[str]:
    p = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    return set(p.stdout.split())


def test_every_output_is_kept_by_git_or_by_dvc_never_by_neither_or_both():
    outs = _outputs()
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = _ignored([path for path, _ in outs])
    lost = [path for path, cached in outs if not cached and path in ignored]
    twice = [path for path, cached in outs if cached and path not in ignored]
    assert lost == [], f"cache: false outputs git ignores (a clone has neither): {lost}"
    assert twice == [], f"DVC-cached outputs git does not ignore: {twice}"
    assert any(cached for _, cached in outs) and any(not cached for _, cached in outs)
