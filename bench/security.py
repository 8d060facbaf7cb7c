"""The security battery: files someone else hands a user, tried as an attacker would, through the real commands.

    python bench/security.py [--entries src.run src.rate …] [--json out.json]

Every case plants a file (a ``conf/`` option, a ``params.yaml``, a model folder, a registered model's document)
that would run a command — ``touch FLAG`` through a callable Hydra's blocklist lets through, a pickle, a loader
module, a Hydra callback, a logging handler —, runs a RAIM command on it, and reads the outcome: **ran code** (the
flag file appeared, or the planted log file was written), one of :data:`reliability.OUTCOMES` otherwise. What
stands in front of each case is docs/security.md's table; ``tests/test_trust.py`` and ``tests/test_model_trust.py``
hold the same classes as tests.

Cases, per Hydra entry (``--entries``, default all eight):

* a hostile node in every config group (``_target_`` + ``_args_``), six callables in every position where a node
  may name a class (stacker, analysis, a roster's backend, a dataset's builder);
* a group file with ``# @package _global_`` setting ``hydra.callbacks``, ``hydra.job_logging`` (a FileHandler),
  ``tracking.uri``; a ``hydra`` node without the directive; a defaults list reaching Hydra's groups; a
  ``!!python/object/apply`` tag; a ``conf/hydra/`` folder;
* ``params.yaml`` (``--config-dir . --config-name params``, as the DVC stages compose it) with a ``hydra`` node, a
  stacker outside the allow-list, a nested target;

and once: a model folder whose pickle and loader run code (with and without RAIM's document), a registered
model's document changed after promotion, a document naming a backend outside the allow-list — through
``src.predict`` and ``src.serve``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

from reliability import ENV, OUTCOMES, cli, free_port, outcome, table  # noqa: E402  (bench/reliability.py: the same runner)

ENTRIES = (
    "src.run",
    "src.analyses",
    "src.rate",
    "src.prevalence",
    "src.monitor",
    "src.noise",
    "src.injection",
    "src.report",
)
CALLABLES = (
    "uuid._get_command_stdout",
    "shutil.copyfile",
    "builtins.open",
    "logging.FileHandler",
    "tarfile.open",
    "os.makedirs",
)
RAN = "ran code"
READ = "read from its document (nothing run)"


def _outcome(p, flag: Path, written: Path | None = None) -> str:
    if flag.exists() or (written is not None and written.exists()):
        return RAN
    return READ if p.returncode == 0 and getattr(p, "read", False) else outcome(p)


def serve(work: Path, model: str, env: dict, timeout: float = 90) -> subprocess.CompletedProcess:
    """``python -m src.serve model`` until it is ready (then stopped: exit 0) or exits by itself."""
    port = free_port()
    full = {**ENV, "RAIM_HYDRA_DIR": str(work / "hydra"), **env}
    args = [sys.executable, "-m", "src.serve", "model", "--model-uri", model, "--port", str(port)]
    proc = subprocess.Popen(args, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, out = time.time() + timeout, ""
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                proc.terminate()
                out, err = proc.communicate(timeout=30)
                p = subprocess.CompletedProcess(args, 0, out, err)
                p.read = True  # type: ignore[attr-defined]
                return p
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _row(kind: str, name: str, p, flag: Path, written: Path | None = None) -> dict:
    last = (p.stderr.strip().splitlines() or [""])[-1]
    return {"kind": kind, "input": name, "outcome": _outcome(p, flag, written), "line": last[:200]}


def config_files(tmp: Path, flag: Path, log: Path) -> dict[str, tuple[str, str]]:
    """name → (group, text) of each hostile group file."""
    cmd = f"_args_: [touch, {flag}]"
    files = {f"{g}: _target_ + _args_": (g, f"_target_: uuid._get_command_stdout\n{cmd}\n") for g in groups()}
    for c in CALLABLES:
        files[f"stacker: {c}"] = ("stacker", f"_target_: {c}\n")
        files[f"analysis: {c}"] = ("analysis", f"_target_: {c}\n")
        files[f"roster backend: {c}"] = ("roster", f"name: x\nmembers:\n  - name: a\n    backend: {{_target_: {c}}}\n")
        files[f"dataset builder: {c}"] = ("dataset", f"name: x\nbuilder: {{_target_: {c}}}\n")
    glob = "# @package _global_\n"
    files |= {
        "@package _global_: hydra.callbacks": (
            "roster",
            f"{glob}hydra:\n  callbacks:\n    x:\n      _target_: uuid._get_command_stdout\n      {cmd}\n",
        ),
        "@package _global_: hydra.job_logging FileHandler": (
            "frame",
            f"{glob}hydra:\n  job_logging:\n    version: 1\n    handlers:\n      f:\n"
            f"        class: logging.FileHandler\n        filename: {log}\n    root:\n      handlers: [f]\n",
        ),
        "@package _global_: tracking.uri": ("stacker", f"{glob}tracking:\n  uri: sqlite:///{tmp}/elsewhere.db\n"),
        "a hydra node without the directive": ("analysis", "hydra:\n  callbacks:\n    x: {_target_: os.system}\n"),
        "defaults reaching hydra's groups": ("suite", "defaults:\n  - override /hydra/job_logging: disabled\n"),
        "!!python/object/apply tag": ("stacker", f"C: !!python/object/apply:os.system ['touch {flag}']\n"),
    }
    return files


def groups() -> list[str]:
    return sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir())


def config_cases(tmp: Path, entries: tuple[str, ...]) -> list[dict]:
    rows = []
    for i, entry in enumerate(entries):
        work = tmp / f"conf-{i}"
        conf = work / "conf"
        shutil.copytree(ROOT / "conf", conf)
        flag, log = work / "FLAG", work / "written.log"
        env = {"RAIM_CONF_DIR": str(conf)}
        for j, (name, (group, text)) in enumerate(config_files(work, flag, log).items()):
            (conf / group / f"case{j}.yaml").write_text(text)
            p = cli(work, entry, f"{group}=case{j}", "tracking.enabled=false", env=env, timeout=300)
            rows.append(_row(f"config file ({entry})", name, p, flag, log))
            (conf / group / f"case{j}.yaml").unlink()
        (conf / "hydra" / "job_logging").mkdir(parents=True)
        (conf / "hydra" / "job_logging" / "evil.yaml").write_text(f"version: 1\nroot: {{handlers: []}}\n# {flag}\n")
        p = cli(work, entry, "tracking.enabled=false", env=env, timeout=300)
        rows.append(_row(f"config file ({entry})", "a conf/hydra/ folder", p, flag))
        shutil.rmtree(conf / "hydra")
        text = (ROOT / "params.yaml").read_text()
        for name, params in {
            "params.yaml: a hydra node": text
            + f"hydra:\n  callbacks:\n    x:\n      _target_: uuid._get_command_stdout\n"
            f"      _args_: [touch, {flag}]\n",
            "params.yaml: stacker outside the allow-list": text.replace(
                "_target_: src.core.aggregate.StackedLogit", "_target_: uuid._get_command_stdout"
            ),
            "params.yaml: a nested target": text + "noise_extra:\n  x: {_target_: os.system}\n",
        }.items():
            (work / "params.yaml").write_text(params)
            p = cli(
                work, entry, "--config-dir", str(work), "--config-name", "params", "tracking.enabled=false", timeout=300
            )
            rows.append(_row(f"params.yaml ({entry})", name, p, flag))
    return rows


class Payload:
    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (os.system, (f"touch {self.flag}",))


def model_cases(tmp: Path) -> list[dict]:
    """Model folders and registry entries through src.predict and src.serve."""
    import mlflow
    import numpy as np
    from mlflow.tracking import MlflowClient

    from src.core.aggregate import StackedLogit
    from src.mlops import artifact, packaging, serving

    work, flag = tmp / "models", tmp / "models" / "FLAG"
    work.mkdir()
    uri = f"sqlite:///{work}/m.db"
    mlflow.set_tracking_uri(uri)
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 300)
    X = np.column_stack([np.where(rng.random(300) < 0.8, gold, 1 - gold) for _ in range(2)]).astype(float)
    with mlflow.start_run():
        info = packaging.log_stacker(StackedLogit().fit(X, gold), ["smollm135m", "lexical"])
    mv = mlflow.register_model(info.model_uri, "sec")
    MlflowClient().set_registered_model_alias("sec", "champion", mv.version)
    folder = Path(MlflowClient().get_logged_model(info.model_id).artifact_location.removeprefix("file://"))
    planted = work / "planted"
    shutil.copytree(folder, planted)
    (planted / "python_model.pkl").write_bytes(pickle.dumps(Payload(flag)))
    (planted / "code" / "evil_loader.py").write_text(f"import pathlib\npathlib.Path({str(flag)!r}).touch()\n")
    mlmodel = planted / "MLmodel"
    mlmodel.write_text(mlmodel.read_text().replace("loader_module: mlflow.pyfunc.model", "loader_module: evil_loader"))
    pickle_only = work / "pickle-only"
    shutil.copytree(planted, pickle_only)
    (pickle_only / "artifacts" / artifact.DOCUMENT).unlink()
    hostile_doc = work / "hostile-doc"
    shutil.copytree(folder, hostile_doc)
    doc = json.loads((hostile_doc / "artifacts" / artifact.DOCUMENT).read_text())
    doc.update(
        kind="panel",
        roster={"name": "x", "members": [{"name": "smollm135m", "backend": {"_target_": "os.system"}}]},
        frames=serving.frame_configs(),
        default_frame="claim",
        config={"cache_dir": str(work / "cache"), "compute": False, "monitor_store": ""},
    )
    (hostile_doc / "artifacts" / artifact.DOCUMENT).write_text(json.dumps(doc))
    items = work / "items.jsonl"
    items.write_text(
        json.dumps({"item_id": "1", "candidate": "Paris is in France.", "evidence": "Paris, France."}) + "\n"
    )
    env = {"MLFLOW_TRACKING_URI": uri}
    cases = {
        "a folder whose pickle and loader run code, with its document": str(planted),
        "a folder whose pickle and loader run code, without a document": str(pickle_only),
        "a document naming a backend outside the allow-list": str(hostile_doc),
    }
    tampered = "a registered model's document changed after registration"
    rows = []
    for name, model in [*cases.items(), (tampered, "models:/sec@champion")]:
        if name == tampered:
            doc_path = folder / "artifacts" / artifact.DOCUMENT
            doc_path.write_bytes(doc_path.read_bytes().replace(b'"threshold": 0.5', b'"threshold": 0.99'))
        p = cli(
            work,
            "src.predict",
            "--model-uri",
            model,
            "--roster",
            "tiny",
            "--cache-dir",
            str(work / "cache"),
            "--no-progress",
            str(items),
            env=env,
        )
        p.read = True  # type: ignore[attr-defined]
        rows.append(_row("model (src.predict)", name, p, flag))
        rows.append(_row("model (src.serve)", name, serve(work, model, env), flag))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", nargs="*", default=list(ENTRIES), choices=ENTRIES)
    ap.add_argument("--json", default=None, help="write every outcome here")
    a = ap.parse_args(argv)
    outcomes = (RAN, READ, *OUTCOMES)
    with tempfile.TemporaryDirectory(prefix="raim-security-") as t:
        rows = config_cases(Path(t), tuple(a.entries)) + model_cases(Path(t))
    print(table(rows, outcomes))
    for r in rows:
        if r["outcome"] not in (OUTCOMES[0], READ):
            print(f"  NOT REFUSED [{r['outcome']}] {r['kind']}: {r['input']}: {r['line']}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
