"""The file plumbing every stage shares: atomic writes (the old file survives any failure), one lock helper with a
bounded wait, and the writers that go through them."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from src.core.errors import RaimError
from src.io.files import atomic_path, atomic_write_text, file_lock


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "results.json"
    atomic_write_text(out, "old\n")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_atomic_path_keeps_the_suffix_for_writers_that_read_it(tmp_path):
    with atomic_path(tmp_path / "fig.png") as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path
        tmp.write_bytes(b"\x89PNG")
    assert (tmp_path / "fig.png").read_bytes() == b"\x89PNG" and oct((tmp_path / "fig.png").stat().st_mode)[
        -3:
    ] == "644"


def _hold(path, seconds, ready):
    with file_lock(path, "test store"):
        ready.set()
        time.sleep(seconds)


def test_a_lock_held_elsewhere_is_waited_for_then_named_in_one_line(tmp_path):
    lock = tmp_path / ".store.lock"
    ready = mp.Event()
    p = mp.Process(target=_hold, args=(lock, 3.0, ready))
    p.start()
    try:
        assert ready.wait(20)
        with pytest.raises(RaimError, match=r"test store: .*\.store\.lock stayed locked for 0 s"):
            with file_lock(lock, "test store", timeout_s=0.2):
                pass
    finally:
        p.join(20)
    with file_lock(lock, "test store", timeout_s=5):  # released when the holder ends
        pass


def test_the_report_replaces_the_old_file_whole(tmp_path, monkeypatch):
    """A reader never sees a half-written report: the new one is renamed over the old file (a new inode), the old
    one is never truncated in place."""
    from src.present import report

    path = tmp_path / "report.md"
    path.write_text("previous report\n")
    before = path.stat().st_ino
    monkeypatch.setattr(report, "markdown", lambda *a, **k: "new report\n")
    monkeypatch.setattr(report, "draw", lambda *a, **k: [])
    report.write_docs({"datasets": {}}, None, tmp_path / "figs", path)
    assert path.read_text() == "new report\n" and path.stat().st_ino != before


def test_a_cache_identity_sidecar_needs_no_fixed_temporary_name(tmp_path):
    """Two writers of the same sidecar used one fixed ``.tmp`` name: a leftover (here a folder in its place)
    broke the write. Each write now has its own temporary."""
    from src.judges.cache import VerdictCache, write_identity

    cache = VerdictCache(tmp_path, "m", {"backend": "x", "n": 1})
    cache.path.with_suffix(".identity.json").with_suffix(".tmp").mkdir(parents=True)
    write_identity(cache)
    assert cache.path.with_suffix(".identity.json").is_file()


def test_the_tracked_beta_table_writes_rounding_noise_as_zero():
    """A β of 1e-16 (a member whose vote never changes) depends on the floating-point path: it is written as 0."""
    from src.present.stagefiles import beta_rows

    doc = {
        "datasets": {
            "d": {"stacker": {"beta_mean": {"m1": 6.579e-16, "m2": 0.52}, "beta_full": {"m1": -1.4e-14, "m2": 0.53}}}
        }
    }
    rows = beta_rows(doc)
    assert rows["beta"].tolist() == [0.0, 0.52] and rows["beta_full"].tolist() == [0.0, 0.53]
