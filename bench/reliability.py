"""Reliability at the user's boundary (issue 10): the README's reliability table, measured here.

    python bench/reliability.py [--kills 8] [--concurrent 3] [--json out.json]

Four parts, every one through the real commands (subprocesses), nothing mocked:

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
"""

from __future__ import annotations

import argparse
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import malformed  # noqa: E402  (tests/malformed.py: the catalogues)

ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "RAIM_DEBUG": "0",
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
ENV.pop("HYDRA_FULL_ERROR", None)
ENV["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{ENV.get('PATH', '')}"
OUTCOMES = ("rejected with one line", "accepted, reported by file and line", "traceback", "accepted silently",
            "rejected unclearly")


def cli(tmp: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**ENV, "RAIM_HYDRA_DIR": str(tmp / "hydra"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/m.db"}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


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
    return cli(tmp, "src.run", f"verdicts={path}", "tracking.enabled=false", "analysis.n_boot=50",
               "analysis.abstention_contrast=false", f"output={tmp}/out/results.json")


def damaged_caches(tmp: Path) -> dict[str, Path]:
    """Copies of the committed verdict cache, each damaged one way (qwen05b's file; ``w`` is the index of its first
    WiCE record, an item of the analysed set). Damage to an analysed record must stop the run; a bad line that
    leaves every item cached may be accepted, but only reported by file and line."""
    def at_w(new):
        return lambda ls, w: [new(ln) if i == w else ln for i, ln in enumerate(ls)]

    damages = {
        "cache: garbage line in place of a record": at_w(lambda ln: "garbage\n"),
        "cache: `42` in place of a record": at_w(lambda ln: "42\n"),
        "cache: record with vote 2": at_w(lambda ln: ln.replace('"vote": 0', '"vote": 2')
                                           .replace('"vote": 1', '"vote": 2').replace('"vote": null', '"vote": 2')),
        "cache: record cut in half": at_w(lambda ln: ln[: len(ln) // 2] + "\n"),
        "cache: 170 of 200 WiCE records missing": lambda ls, w: [ln for ln in ls if '"dataset": "wice"' not in ln]
        + [ln for ln in ls if '"dataset": "wice"' in ln][:30],
        "cache: garbage lines appended (every item still cached)": lambda ls, w: ls + ["42\n", "{oops\n"],
        "cache: torn last write (every item still cached)": lambda ls, w: ls + ['{"key": "ab'],
    }
    out = {}
    for i, (name, damage) in enumerate(damages.items()):
        dst = tmp / "caches" / f"c{i}"
        shutil.copytree(ROOT / "verdicts" / "cache", dst)
        f = next((dst / "qwen05b").glob("*.jsonl"))
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
        "run: roster with no cached verdicts": ["src.run", "roster=tiny", "tracking.enabled=false",
                                                f"output={tmp}/out/r.json"],
        "run: analysis.n_boot=0": ["src.run", "analysis.n_boot=0", "tracking.enabled=false"],
        "run: analysis.level=95": ["src.run", "analysis.level=95", "tracking.enabled=false"],
        "run: stacker.C=-1": ["src.run", "stacker.C=-1", "tracking.enabled=false"],
        "run: stacker.abstention unknown": ["src.run", "stacker.abstention=drop", "tracking.enabled=false"],
        "judges: unknown roster": ["src.judges", "--roster", "nope"],
        "judges: unknown dataset": ["src.judges", "--datasets", "nope", "--items-dir", str(tmp)],
        "judges: unknown member": ["src.judges", "--members", "zz"],
        "data: raw folder missing": ["src.data", "--raw-dir", str(tmp / "none"), "--own-dir", str(tmp / "none2"),
                                     "--out-dir", str(tmp / "o")],
        "data: unknown dataset": ["src.data", "--datasets", "nope", "--out-dir", str(tmp / "o")],
        "data: non-UTF-8 raw file": ["src.data", "--raw-dir", str(raw), "--datasets", "wice", "--out-dir",
                                     str(tmp / "o")],
        "registry: promote an unknown run id": ["src.registry", "promote", "--run-id", "0123456789abcdef"],
        "registry: show a missing model": ["src.registry", "show", "--name", "no-such-model"],
        "serve: unknown model": ["src.serve", "model", "--model-uri", "models:/nope@champion"],
        "report: corrupt results.json": ["src.report", f"output={tmp}/corrupt.json", f"suite.output={tmp}/s.json",
                                         f"suite.report={tmp}/r.md", f"suite.figures_dir={tmp}/f"],
        # beyond the paper: the studies' and the judge engine's settings
        "suite: cascade expensive member unknown": ["src.analyses", "suite=fast", "suite.cascade.expensive=nope",
                                                    f"suite.output={tmp}/s.json", "tracking.enabled=false"],
        "suite: cascade share 1.5": ["src.analyses", "suite=fast", "suite.cascade.operating_points=[1.5]",
                                     f"suite.output={tmp}/s.json", "tracking.enabled=false"],
        "prevalence: prevalence 0": ["src.prevalence", "prevalence.prevalences=[0]", "tracking.enabled=false",
                                     f"prevalence.output={tmp}/p.json"],
        "prevalence: window 0": ["src.prevalence", "prevalence.window=0", "tracking.enabled=false",
                                 f"prevalence.output={tmp}/p.json"],
        "monitor: store missing": ["src.monitor", "monitor.source=store", f"monitor.store={tmp}/none.sqlite",
                                   "monitor.calibration.dataset=wice", "tracking.enabled=false",
                                   f"monitor.output={tmp}/m.json"],
        "monitor: unknown scenario": ["src.monitor", "monitor.replay.scenario=meteor", "tracking.enabled=false",
                                      f"monitor.output={tmp}/m.json"],
        "noise: rate 1.5": ["src.noise", "noise.rates=[1.5]", "tracking.enabled=false", f"noise.output={tmp}/n.json"],
        "noise: unknown noise type": ["src.noise", "noise.types=[xx]", "tracking.enabled=false",
                                      f"noise.output={tmp}/n.json"],
        "noise: unknown stacker option": ["src.noise", "noise.stackers=[nope]", "tracking.enabled=false",
                                          f"noise.output={tmp}/n.json"],
        "judges: ray actors 0": ["src.judges", "--roster", "tiny", "--datasets", "truthfulqa", "--compute",
                                 "--engine", "ray", "--ray-actors", "0", "--cache-dir", str(tmp / "c"),
                                 "--tables-dir", str(tmp / "t")],
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
        p = cli(tmp, "src.run", "dataset=wice", f"paths.cache_dir={cache}", "tracking.enabled=false",
                "analysis.n_boot=50", f"output={tmp}/out/r.json")
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
    return [sys.executable, "-m", "src.judges", "--roster", "cpu", "--members", "minilm", "--datasets", "medhallu",
            "--per-dataset", str(n), "--compute", "--cache-dir", str(cache), "--tables-dir", str(tables),
            "--no-progress"]


def records(cache: Path) -> list[dict]:
    f = next((cache / "minilm").glob("*.jsonl"))
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
        proc = subprocess.Popen(judge_cmd(killed, tmp / "t2", n_items), cwd=ROOT, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
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
    return {"items": n_items, "kills": done, "final_exit": final.returncode, "records": len(b),
            "duplicates": len(keys) - len(set(keys)), "lost": len({r["key"] for r in a} - set(keys)),
            "equal_to_uninterrupted": same}


def _count(cache: Path) -> int:
    files = list((cache / "minilm").glob("*.jsonl"))
    return files[0].read_bytes().count(b"\n") if files else 0


# ------------------------------------------------------------------------------- 3. concurrent runs

def concurrent(tmp: Path, n: int) -> dict:
    store = tmp / "concurrent"
    store.mkdir()
    env = {**ENV, "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db", "RAIM_HYDRA_DIR": str(store / "hydra")}
    procs = [subprocess.Popen([sys.executable, "-m", "src.run", "dataset=wice", "analysis=fast",
                               f"output={store}/r{i}.json"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(n)]
    codes = [p.wait() for p in procs]
    tails = [p.stderr.read().strip().splitlines()[-1:] for p in procs]
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    parents = mlflow.search_runs(search_all_experiments=True, output_format="list",
                                 filter_string="tags.kind = 'stacking'")
    parents = [r for r in parents if "mlflow.parentRunId" not in r.data.tags]
    mlflow.set_tracking_uri(None)
    return {"runs": n, "succeeded": sum(c == 0 for c in codes), "results_written":
            sum((store / f"r{i}.json").exists() for i in range(n)), "runs_in_store": len(parents),
            "errors": [t for c, t in zip(codes, tails) if c]}


# ----------------------------------------------------------------------------------- 4. served model

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, payload: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"{}")
        except ValueError:
            return e.code, {"message": body.decode(errors="replace")}


def serve_and_send(args: list[str], port: int, env: dict, requests: dict[str, dict]) -> dict:
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(url + "/ping", timeout=2):
                    break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"server {args[:4]} did not start")
                time.sleep(0.5)
        out = {"tried": len(requests), "400 one line": 0, "400 other": 0, "200": 0, "5xx": 0, "cases": {}}
        for name, payload in requests.items():
            status, body = post(url + "/invocations", payload)
            msg = str(body.get("message", "")) if isinstance(body, dict) else ""
            one = status == 400 and msg and "\n" not in msg and "Traceback" not in msg and "stack_trace" not in body
            key = "400 one line" if one else "400 other" if status == 400 else "200" if status == 200 else "5xx"
            out[key] += 1
            out["cases"][name] = {"status": status, "message": msg[:200]}
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def served(tmp: Path) -> dict:
    """A stacker logged by a real analysis of simulated panels, served both ways."""
    from src.studies import simulate

    store = tmp / "serve"
    store.mkdir()
    table = simulate.panel(150, 2, accuracies=[0.75] * 6, rho=0.05, dataset="good", seed=1)
    table.to_csv(store / "v.csv", index=False)
    env = {**ENV, "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db", "RAIM_HYDRA_DIR": str(store / "hydra")}
    subprocess.run([sys.executable, "-m", "src.run", f"verdicts={store}/v.csv", "analysis=fast",
                    f"output={store}/r.json"], cwd=ROOT, env=env, check=True, capture_output=True)
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    kid = mlflow.search_runs(search_all_experiments=True, output_format="list",
                             filter_string="tags.dataset = 'good'")[0]
    mlflow.set_tracking_uri(None)
    uri = kid.data.tags["stacker_model_uri"]
    members = [f"m{j:02d}" for j in range(6)]
    requests = malformed.serving_requests(members)
    p1, p2 = free_port(), free_port()
    strict = serve_and_send([sys.executable, "-m", "src.serve", "model", "--model-uri", uri, "--port", str(p1)],
                            p1, env, requests)
    plain = serve_and_send([sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager", "local",
                            "-h", "127.0.0.1", "-p", str(p2), "-w", "1"], p2, env, requests)
    return {"strict (python -m src.serve model)": strict, "plain (mlflow models serve)": plain}


# ----------------------------------------------------------------------------------------------- report

def table(rows: list[dict]) -> str:
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    head = "| input | tried | " + " | ".join(OUTCOMES) + " |\n|---|---|" + "---|" * len(OUTCOMES)
    lines = [head]
    for k in [*kinds, "all"]:
        sel = [r for r in rows if k in ("all", r["kind"])]
        counts = [sum(r["outcome"] == o for r in sel) for o in OUTCOMES]
        name = "**all**" if k == "all" else k
        lines.append(f"| {name} | {len(sel)} | " + " | ".join(map(str, counts)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--items", type=int, default=24, help="items of the killed judge run")
    ap.add_argument("--concurrent", type=int, default=3)
    ap.add_argument("--skip", nargs="*", default=[], choices=["inputs", "kills", "concurrent", "serve"])
    ap.add_argument("--json", default=None, help="write every outcome here")
    a = ap.parse_args(argv)
    doc: dict = {}
    with tempfile.TemporaryDirectory(prefix="raim-reliability-") as t:
        tmp = Path(t)
        if "inputs" not in a.skip:
            doc["bad_inputs"], doc["valid_inputs"] = bad_inputs(tmp)
            print(table(doc["bad_inputs"]))
            print(f"valid inputs accepted: {sum(v['accepted'] for v in doc['valid_inputs'])}/{len(doc['valid_inputs'])}")
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
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
