"""Every command answers a bad input with one line `error: …` naming the file / row / field, and exit status 2
(no traceback, no Hydra banner); RAIM_DEBUG=1 brings the traceback back (src/core/errors.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(tmp: Path, *args: str, debug: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m <args>`` in the checkout, its Hydra folder and MLflow store under ``tmp`` (``env`` overrides)."""
    env = {
        **os.environ,
        "RAIM_HYDRA_DIR": str(tmp / "hydra"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/m.db",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        **(env or {}),
    }
    env.pop("HYDRA_FULL_ERROR", None)
    env["RAIM_DEBUG"] = "1" if debug else "0"
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def bad_utf8_raw(tmp: Path) -> Path:
    raw = tmp / "raw"
    (raw / "wice" / "claim").mkdir(parents=True)
    (raw / "wice" / "claim" / "test.jsonl").write_bytes(b'{"label": "supported"}\n\xff\xfe not text\n')
    return raw


CASES = {
    "judges: unknown roster": (lambda t: ["src.judges", "--roster", "nope"], "no roster 'nope'; available:"),
    "judges: unknown dataset": (
        lambda t: ["src.judges", "--datasets", "nope", "--items-dir", str(t)],
        "nope.jsonl not found: build the items first",
    ),
    "judges: unknown member": (lambda t: ["src.judges", "--members", "zz"], "unknown members ['zz']"),
    "data: raw folder missing": (
        lambda t: ["src.data", "--raw-dir", str(t / "none"), "--own-dir", str(t / "none2"), "--out-dir", str(t / "o")],
        "raw data folder",
    ),
    "data: unknown dataset": (
        lambda t: ["src.data", "--datasets", "nope", "--out-dir", str(t / "o")],
        "unknown dataset(s) ['nope']",
    ),
    "data: non-UTF-8 raw file": (
        lambda t: ["src.data", "--raw-dir", str(bad_utf8_raw(t)), "--datasets", "wice", "--out-dir", str(t / "o")],
        "wice/claim/test.jsonl line 2: byte 0xff at offset 23 is not UTF-8 (save it as UTF-8)",
    ),
    "serve: unknown model": (
        lambda t: ["src.serve", "model", "--model-uri", "models:/nope@champion"],
        "model: Registered Model with name=nope not found",
    ),
    "registry: unknown roster": (
        lambda t: ["src.registry", "log-panel", "--roster", "nope", "--stacker-uri", "models:/x@y"],
        "no option 'nope' in the 'roster' group (options: ablation_no_gemma, cpu, openai_server,",
    ),
    "run: output is a directory": (lambda t: ["src.run", f"output={t}", "tracking.enabled=false"], "is a directory"),
    "run: bad judge.missing": (
        lambda t: ["src.run", "judge.missing=sometimes", "tracking.enabled=false", f"output={t}/r.json"],
        "judge: missing='sometimes' is not Literal['error', 'judged_only', 'skip', 'auto'] (JudgeSettings)",
    ),
    "analyses: verdicts file missing": (
        lambda t: ["src.analyses", f"verdicts={t}/none.csv", "tracking.enabled=false"],
        "none.csv: file not found",
    ),
    "run: analysis.n_boot=0": (
        lambda t: ["src.run", "analysis.n_boot=0", "tracking.enabled=false", f"output={t}/r.json"],
        "analysis.n_boot=0: must be an integer ≥ 1",
    ),
    "run: stacker.C=-1": (
        lambda t: ["src.run", "stacker.C=-1", "tracking.enabled=false", f"output={t}/r.json"],
        "stacker.C=-1: must be in (0, inf)",
    ),
    "report: corrupt results.json": (
        lambda t: [
            "src.report",
            f"output={_garbage(t)}",
            f"suite.output={t}/suite.json",
            f"suite.report={t}/report.md",
            f"suite.figures_dir={t}/fig",
        ],
        "r.json: not a readable JSON",
    ),
    # argparse's own errors (a bad or missing option) follow the same rule: one line, exit 2 (src.core.errors.ArgumentParser)
    "judges: unknown engine": (
        lambda t: ["src.judges", "--engine", "spark"],
        "python -m src.judges: argument --engine: invalid choice: 'spark'",
    ),
    "data: an option without its value": (
        lambda t: ["src.data", "--datasets"],
        "python -m src.data: argument --datasets: expected one argument",
    ),
    "predict: no model named": (
        lambda t: ["src.predict", "--candidate", "x"],
        "one of the arguments --model-uri --run-id is required",
    ),
    "serve: no command": (lambda t: ["src.serve"], "python -m src.serve: the following arguments are required: cmd"),
    # the beyond-the-paper studies and the judge engine
    "judges: ray actors 0": (
        lambda t: [
            "src.judges",
            "--roster",
            "tiny",
            "--datasets",
            "truthfulqa",
            "--compute",
            "--engine",
            "ray",
            "--ray-actors",
            "0",
            "--cache-dir",
            str(t / "c"),
            "--tables-dir",
            str(t / "tb"),
        ],
        "judge.ray.actors_per_member: 0 is not a number >= 1",
    ),
    "prevalence: prevalence 0": (
        lambda t: [
            "src.prevalence",
            "prevalence.prevalences=[0]",
            "tracking.enabled=false",
            f"prevalence.output={t}/p.json",
        ],
        "prevalence.prevalences: 0 is not a prevalence in (0, 1)",
    ),
    "monitor: store missing": (
        lambda t: [
            "src.monitor",
            "monitor.source=store",
            f"monitor.store={t}/none.sqlite",
            "monitor.calibration.dataset=wice",
            "tracking.enabled=false",
            f"monitor.output={t}/m.json",
        ],
        "none.sqlite: no monitoring store there",
    ),
    "noise: rate 1.5": (
        lambda t: ["src.noise", "noise.rates=[1.5]", "tracking.enabled=false", f"noise.output={t}/n.json"],
        "noise.rates: noise rate 1.5: must be a number in",
    ),
}


def _garbage(t: Path) -> Path:
    (t / "r.json").write_text('{"datasets": {"x": ')
    return t / "r.json"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(tmp_path, case):
    args, expect = CASES[case]
    p = cli(tmp_path, *args(tmp_path))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (case, p.stdout[-2000:], p.stderr[-2000:])
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and expect in errors[0], (case, p.stderr[-2000:])
    assert not any(ln.startswith("usage:") for ln in lines), (case, p.stderr[-2000:])  # no usage block
    assert "Traceback" not in p.stderr and "HYDRA_FULL_ERROR" not in p.stderr


def test_raim_debug_shows_the_traceback(tmp_path):
    p = cli(tmp_path, "src.judges", "--roster", "nope", debug=True)
    assert p.returncode != 0 and "Traceback" in p.stderr and "RaimError: no roster 'nope'" in p.stderr


@pytest.mark.slow
def test_a_suite_whose_store_cannot_be_made_is_one_line_and_keeps_the_previous_suite_json(tmp_path):
    """The suite logs to MLflow before it writes suite.json (a DVC output), as the studies do: a store that cannot
    be made is the tracking's one line, exit 2, and the previous suite.json stays."""
    out = tmp_path / "suite.json"
    out.write_text('{"previous": true}')
    (tmp_path / "not_a_dir").write_text("")
    store = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/not_a_dir/m.db"}
    p = cli(tmp_path, "src.analyses", f"suite.output={out}", f"suite.figures_dir={tmp_path / 'figures'}", env=store)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and last.startswith(f"error: MLflow tracking at sqlite:///{tmp_path}/not_a_dir/m.db"), (
        p.stderr[-2000:]
    )
    assert "nothing was written to suite.json" in last and "Traceback" not in p.stderr
    assert out.read_text() == '{"previous": true}'
