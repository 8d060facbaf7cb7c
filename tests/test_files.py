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


# Pairs of the same statistic computed under OpenBLAS's Haswell and SkylakeX kernels (the studies' JSON files
# before floats were written by rule): monitor's reference SE, a rate cell's bias (cancellation: 1e-12 relative),
# a prevalence window bound, PPI++ against ppi_py (rounding noise), the suite's fixed-effects coefficient.
KERNEL_PAIRS = [
    (0.02230506435673454, 0.022305064356734537),
    (8.061902904955398e-06, 8.061902904971051e-06),
    (8.737221823861086e-05, 8.737221823859767e-05),
    (1.6653345369377348e-16, 2.7755575615628914e-16),
    (1.0373986471863048, 1.037398647186303),
    (992.4790653539578, 992.4790653539587),
]


def test_a_json_result_does_not_hang_on_the_last_bits_of_its_floats():
    """The same statistic computed in another summation order is written as the same bytes (every JSON result
    goes through to_json): its last bits are not part of the result."""
    from src.io.files import to_json

    for a, b in KERNEL_PAIRS:
        assert to_json({"x": a, "xs": [a, -a]}) == to_json({"x": b, "xs": [b, -b]}), (a, b)


def test_written_floats_keep_seven_significant_digits_down_to_the_ninth_decimal():
    """The rule (docs/data.md): 7 significant digits, never finer than 1e-9; noise under 5e-10 is 0, −0 is 0;
    values with fewer digits, integers, booleans and null are written as they are; rounding twice changes
    nothing (a document read and written again keeps its bytes)."""
    import json

    from src.io.files import to_json, written_float

    assert written_float(992.4790653539578) == 992.4791
    assert written_float(1.9454876793) == 1.945488
    assert written_float(3.734684515948285e-08) == 3.7e-08  # a p-value: 9 decimals leave 2 digits
    assert written_float(6e-10) == 1e-09 and written_float(4.9e-10) == 0.0
    assert str(written_float(-2.7e-17)) == "0.0" and str(written_float(-0.0)) == "0.0"
    assert written_float(0.435) == 0.435 and written_float(80612.65745421071) == 80612.66
    doc = {"n": 200, "ok": True, "none": None, "p": [0.1, 0.30000000000000004, float("nan")], "big": 12345678.9}
    text = to_json(doc)
    assert json.loads(text) == {"n": 200, "ok": True, "none": None, "p": [0.1, 0.3, None], "big": 12345680.0}
    assert to_json(json.loads(text)) == text
