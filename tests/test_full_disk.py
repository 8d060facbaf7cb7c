"""A write that finds no room (a full disk, a file-size limit) names the file being written, in one line, through
every command that writes: src.run's results, src.judges' verdict cache, src.predict --out, src.data's items
(src/io/files.py: ``writing``). The limit is real: the command runs under ``RLIMIT_FSIZE`` (``ulimit -f``), so the
write fails as on a full disk, with ``[Errno 27] File too large`` and no file name."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from test_boundary import saved_models

ROOT = Path(__file__).resolve().parents[1]
WHY = "cannot be written (the file would pass the file-size limit (ulimit -f))"


def limited(tmp: Path, args: list[str], limit: int) -> subprocess.CompletedProcess:
    """``python -m <args>`` with files limited to ``limit`` bytes (its Hydra folder and store under ``tmp``)."""
    env = {
        **os.environ,
        "RAIM_HYDRA_DIR": str(tmp / "hydra"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/m.db",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "RAIM_DEBUG": "0",
    }

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, preexec_fn=cap
    )


def items(tmp: Path) -> Path:
    """Two items whose id field (copied to src.predict's output, never to the cache) is 20 kB long."""
    path = tmp / "items.jsonl"
    rows = [{"item_id": f"i{i}", "candidate": f"claim {i}", "conversation_id": "c" * 20000} for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CASES = {
    "run: results.json": (
        lambda t: ["src.run", "dataset=wice", "analysis=fast", "tracking.enabled=false", f"output={t}/o/results.json"],
        lambda t: t / "o" / "results.json",
    ),
    "judges: the verdict cache": (
        lambda t: [
            "src.judges",
            *("--roster", "tiny", "--members", "lexical", "--datasets", "wice", "--compute", "--no-progress"),
            *("--cache-dir", str(t / "c"), "--tables-dir", str(t / "t")),
        ],
        lambda t: next((t / "c" / "wice" / "lexical").glob("*.jsonl")),
    ),
    "predict: --out": (
        lambda t: [
            "src.predict",
            str(items(t)),
            *("--model-uri", str(t / "panel"), "--cache-dir", str(t / "c"), "--no-progress"),
            *("--out", str(t / "o.jsonl")),
        ],
        lambda t: t / "o.jsonl",
    ),
    "data: the items": (
        lambda t: ["src.data", "--datasets", "wice", "--out-dir", str(t / "d")],
        lambda t: t / "d" / "wice.jsonl",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_write_that_finds_no_room_names_its_file(tmp_path, case):
    args, written = CASES[case]
    if case.startswith("predict"):
        saved_models(tmp_path)  # tmp_path/panel: the lexical judge's panel model
    p = limited(tmp_path, args(tmp_path), limit=16 * 1024)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert lines[-1].startswith(f"error: {written(tmp_path)}: {WHY}"), lines[-1]
