"""Issue 10, item 5 "Secrets and races": redaction by shape (and what it must keep), Hydra's run folder holds no
secret, concurrent first runs on a new MLflow store, atomic DVC stage files, no timings in suite.json."""

from __future__ import annotations

import base64
import json
import os
import random
import string
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from src.io import config
from src.io import files as fsutil
from src.mlops import redact, store
from src.mlops import tracking as track
from src.present import stagefiles
from src.studies import simulate

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
R = random.Random(10)
ALNUM = string.ascii_letters + string.digits


def rnd(n: int, alphabet: str = ALNUM) -> str:
    return "".join(R.choice(alphabet) for _ in range(n))


HEX40, HEX64, HEX32 = rnd(40, "0123456789abcdef"), rnd(64, "0123456789abcdef"), rnd(32, "0123456789abcdef")
FAKE_ANTHROPIC = "sk-ant-api03-" + rnd(80, ALNUM + "-_") + "AA"

# Each value (a fake secret) must disappear wherever it appears.
SECRETS = {
    "anthropic": FAKE_ANTHROPIC,
    "openai legacy": "sk-" + rnd(48),
    "openai project": "sk-proj-" + rnd(60, ALNUM + "-_") + "x9",
    "deepseek": "sk-" + HEX32,
    "bearer": "Bearer " + rnd(40, ALNUM + "._-"),
    "groq": "gsk_" + rnd(52),
    "google": "AIza" + rnd(35, ALNUM + "-_"),
    "huggingface": "hf_" + rnd(34, string.ascii_letters),
    "github": "ghp_" + rnd(36),
    "github fine-grained": "github_pat_" + rnd(22) + "_" + rnd(59),
    "gitlab": "glpat-" + rnd(20),
    "slack": "xoxb-" + rnd(12, string.digits) + "-" + rnd(24),
    "aws access key id": "AKIA" + rnd(16, string.ascii_uppercase + string.digits),
    "jwt": "eyJhbGciOiJIUzI1NiJ9." + base64.urlsafe_b64encode(b'{"sub":"1234567890"}').decode().rstrip("=")
           + "." + rnd(43, ALNUM + "-_"),
    "hex 40": HEX40,
    "hex 64": HEX64,
    "base64 32 bytes": base64.b64encode(bytes(R.randrange(256) for _ in range(32))).decode(),
    "base64url token": base64.urlsafe_b64encode(bytes(R.randrange(256) for _ in range(33))).decode(),
    "alnum 40": rnd(40),
}

# Where a value can sit: a config param, a nested list, free text, a URL.
CONTEXTS = {
    "param": lambda s: {"judge": {"endpoint_note": s}},
    "nested list": lambda s: {"judge": {"headers": ["x-client: raim", s], "extra": [[1, s]]}},
    "free text": lambda s: f"calling the judge with {s} (retry 2)",
    "url": lambda s: f"https://api.example.org/v1/judge?note={s}&n=2",
}


def _secret_part(value: str) -> str:
    return value.split(" ", 1)[1] if value.startswith("Bearer ") else value


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("name", SECRETS)
def test_secret_shapes_are_redacted_wherever_they_appear(name, context):
    value = SECRETS[name]
    out = json.dumps(redact.scrub(CONTEXTS[context](value), secrets=[]))
    assert _secret_part(value) not in out and redact.REDACTED in out
    if name == "bearer":
        assert "Bearer ***" in out  # the scheme word stays


NOT_SECRETS = [
    "/tmp/raim-hydra/runs/2026-12-01_00-19-59",
    "models/hf/Qwen2.5-Coder-1.5B",
    "meta-llama/Meta-Llama-3-8B-Instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "bartowski/Qwen2.5-Coder-1.5B-Instruct-GGUF",
    "CohereLabs/c4ai-command-r7b-12-2024",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "src.judges.backends.vllm_backend.VLLMBackend",
    "/home/User/Projects/RAIM2024/Data2025/Run3X",
    "transformers.Qwen2VLForConditionalGeneration",
    "sk-learn-model-version-1",
    "task-force-alpha-2024-release-candidate",
    "https://example.org/data/train.jsonl",
    "123e4567-e89b-12d3-a456-426614174000",
    "12345678901234567890123456789012345",
    f"runs:/{HEX32}/stacker",
    f"models:/m-{HEX32}",
    "the bearer of bad news",
    "max_tokens=5 temperature=0",
    "Is the claim fully supported by the document? Reply with one word: Yes or No.",
]


@pytest.mark.parametrize("value", NOT_SECRETS)
def test_paths_model_ids_and_prose_survive(value):
    assert redact.scrub_text(value, secrets=[]) == value
    assert redact.scrub({"judge": {"model": value, "list": [value]}}, secrets=[]) == \
        {"judge": {"model": value, "list": [value]}}


@pytest.mark.parametrize("key", ["git_commit", "mlflow.source.git.commit", "revision", "sha", "sha256", "commit",
                                 "hash", "digest", "md5", "verdict_table_sha256", "balanced_set_sha256", "run_id",
                                 "parentRunId", "stacker_uri"])
def test_values_under_hash_declaring_keys_keep_their_hashes(key):
    value = HEX32 if key == "md5" else HEX64 if "256" in key else HEX40
    value = f"/tmp/x/mlruns/raim/{HEX32}/artifacts/stacker" if key == "stacker_uri" else value
    assert redact.scrub({key: value}, secrets=[]) == {key: value}
    assert redact.scrub({key: [value, f"sha256:{HEX64}"]}, secrets=[]) == {key: [value, f"sha256:{HEX64}"]}
    # … but a provider key shape is redacted there too
    assert redact.scrub({key: FAKE_ANTHROPIC}, secrets=[]) == {key: "***"}


def test_secret_key_names_and_lookalikes():
    secret = ["HF_TOKEN", "accessToken", "db_password", "PGPASSWORD", "client_secret", "x-api-key", "apiKey", "auth",
              "ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "private_key", "refresh_token", "passphrase"]
    plain = ["max_tokens", "tokenizer", "tokens_per_item", "author", "SSH_AUTH_SOCK", "token_file", "XAUTHORITY",
             "auth_type", "password_path", "key", "model", "usd_per_mtok_in"]
    assert [k for k in secret if not redact.secret_key(k)] == []
    assert [k for k in plain if redact.secret_key(k)] == []
    out = redact.scrub({k: "plain-value-123" for k in secret + plain}, secrets=[])
    assert {k for k, v in out.items() if v == "***"} == set(secret)
    assert redact.scrub({"credentials": {"user": "bob", "pass": "hunter2"}, "tokens": None, "max_tokens": 5},
                       secrets=[]) == {"credentials": "***", "tokens": None, "max_tokens": 5}


def test_named_pairs_env_values_and_url_passwords_in_free_text(monkeypatch):
    monkeypatch.setenv("GROQ_API_KEY", "plain-no-shape-value")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-agent-sock-path")
    text = ("python -m src.run +judge.api_key=hunter2 +db.password='two words' max_tokens=5 "
            "https://bob:s3cret@db.example.org/x?access_token=abc123&page=2 plain-no-shape-value /tmp/ssh-agent-sock-path")
    out = redact.scrub_text(text)
    for gone in ("hunter2", "two words", "s3cret", "abc123", "plain-no-shape-value"):
        assert gone not in out
    for kept in ("+judge.api_key=***", "max_tokens=5", "https://***@db.example.org/x?access_token=***&page=2",
                 "/tmp/ssh-agent-sock-path"):
        assert kept in out


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("overrides", [("roster=paper",), ("roster=cpu",), ("roster=paper", "frame=claim"),
                                       ("roster=cpu", "frame=def_on"),
                                       ("roster=paper", f"roster.members.0.backend.revision={HEX40}")])
def test_nothing_in_the_composed_default_config_is_redacted(overrides):
    data = track.to_container(_compose(*overrides))
    assert redact.scrub(data, secrets=[]) == data
    assert config.flatten(redact.scrub(data, secrets=[])) == config.flatten(data)


def test_start_run_keeps_the_git_commit_and_redacts_user_tags(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for k, v in QUIET.items():
        monkeypatch.setenv(k, v)
    try:
        with store.quiet_mlflow(), track.start_run(_compose("roster=cpu"), "test",
                                                   tags={"note": SECRETS["groq"], "model_sha256": HEX64}) as run:
            rid = run.info.run_id
        tags = mlflow.get_run(rid).data.tags
    finally:
        mlflow.set_tracking_uri(None)
    assert len(tags["git_commit"]) == 40 and tags["mlflow.source.git.commit"] == tags["git_commit"]
    assert tags["note"] == "***" and tags["model_sha256"] == HEX64


# ------------------------------------------------------------------------------------- Hydra's run folder

@pytest.fixture(scope="module")
def small_verdicts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("verdicts") / "v.csv"
    simulate.suite(n_datasets=2, n_items=200, n_members=4, seed=4).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("mode", ["run", "multirun"])
def test_hydra_run_folder_holds_no_secret(tmp_path, small_verdicts, mode):
    env = {**os.environ, **QUIET, "RAIM_HYDRA_DIR": str(tmp_path / "hydra")}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = [sys.executable, "-m", "src.run", *(["-m"] if mode == "multirun" else []), f"verdicts={small_verdicts}",
            "analysis=fast", "analysis.n_boot=50", "tracking.enabled=false", f"output={tmp_path}/r.json",
            f"+judge.api_key={FAKE_ANTHROPIC}"]
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    # a single run writes the named output (and its run folder); a sweep job only its own folder
    results = tmp_path / "r.json" if mode == "run" else next((tmp_path / "hydra" / "multirun").glob("*/0/results.json"))
    assert results.is_file() and any(f.name.endswith(".log") for f in files)
    assert [str(f) for f in files if FAKE_ANTHROPIC.encode() in f.read_bytes()] == []
    saved = list((tmp_path / "hydra").rglob(".hydra/config.yaml"))  # the record of the run stays, scrubbed
    assert len(saved) == 1 and "api_key: '***'" in saved[0].read_text()
    assert "+judge.api_key=***" in saved[0].with_name("overrides.yaml").read_text()
    if mode == "multirun":
        sweep = next((tmp_path / "hydra" / "multirun").iterdir())
        assert (sweep.stat().st_mode & 0o777) == 0o700 and "+judge.api_key=***" in (sweep / "multirun.yaml").read_text()


# -------------------------------------------------------------------------- concurrent runs on a new store

CHILD = r"""
import sys, time
from pathlib import Path
import mlflow
from hydra import compose, initialize_config_dir
from src.mlops import store
tmp = Path(sys.argv[1])
with initialize_config_dir(config_dir=str(Path.cwd() / "conf"), version_base=None):
    cfg = compose(config_name="config", overrides=[f"tracking.uri=sqlite:///{tmp}/new.db"])
(tmp / f"ready{sys.argv[2]}").touch()
while not (tmp / "go").exists():  # everyone imported: start together
    time.sleep(0.005)
with store.quiet_mlflow():
    store.setup(cfg)
    with mlflow.start_run():
        mlflow.log_metric("x", 1.0)
"""


def test_concurrent_first_runs_on_a_new_store_all_succeed(tmp_path):
    """Without :func:`src.mlops.store.store_lock` this fails nearly every time (N=3): alembic's "Online migration expected
    to match one row when updating … in 'alembic_version'; 0 found" or sqlite "database is locked"."""
    import mlflow

    n = 3
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(QUIET)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(i)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    deadline = time.monotonic() + 300
    while (sum((tmp_path / f"ready{i}").exists() for i in range(n)) < n and all(p.poll() is None for p in procs)
           and time.monotonic() < deadline):
        time.sleep(0.02)
    (tmp_path / "go").touch()
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    assert [rc for rc, _ in results] == [0] * n, [err.strip().splitlines()[-1:] for rc, err in results if rc]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/new.db")
    try:
        runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
    assert len(runs) == n and all(r.data.metrics == {"x": 1.0} for r in runs)
    assert not list(tmp_path.glob("*.lock")) and (tmp_path / "mlruns" / ".new.db.lock").is_file()


# -------------------------------------------------------------------------------------- DVC stage files

def _doc(kappa: float) -> dict:
    est = lambda v: {"estimate": v, "ci": [v - 0.1, v + 0.1]}  # noqa: E731
    ds = {"n": 100, "comparators": {"stacked": {m: est(kappa) for m in ("kappa", "bacc", "f1")},
                                    "best_cv": {"kappa": est(kappa - 0.05)}},
          "deltas": {"best_cv": {"kappa": {**est(0.05), "call": "win"}}},
          "admissibility": {"admissible": True, "phi_bar": 0.1, "members_at_kappa0": 0},
          "stacker": {"beta_mean": {"a": 1.0, "b": kappa}, "beta_full": {"a": 1.1, "b": kappa}}}
    return {"datasets": {"sim": ds}}


def test_stage_files_are_written_atomically(tmp_path, monkeypatch):
    metrics, betas = tmp_path / "results" / "metrics.json", tmp_path / "results" / "beta.csv"
    stagefiles.write_stage_files(_doc(0.5), metrics, betas)
    assert json.loads(metrics.read_text())["sim"]["stacked"]["kappa"] == 0.5
    assert pd.read_csv(betas)["beta"].tolist() == [1.0, 0.5]
    before = {p: p.read_bytes() for p in (metrics, betas)}

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "replace", boom)  # the failure after the new text was written
    with pytest.raises(OSError):
        stagefiles.write_stage_files(_doc(0.7), metrics, betas)
    assert {p: p.read_bytes() for p in (metrics, betas)} == before
    assert sorted(p.name for p in metrics.parent.iterdir()) == ["beta.csv", "metrics.json"]  # no temp file left
    monkeypatch.undo()
    stagefiles.write_stage_files(_doc(0.7), metrics, betas)
    assert json.loads(metrics.read_text())["sim"]["stacked"]["kappa"] == 0.7 and (metrics.stat().st_mode & 0o777) == 0o644


def test_suite_json_holds_no_timings(tmp_path, monkeypatch):
    """suite.json is a DVC output: wall times would make every rerun differ (they go to MLflow)."""
    import src.analyses.__main__ as suite_main
    from src.present import figures

    doc = {"datasets": {}, "cost": {}, "timings": {"budget": 12.5, "panel": 3.25}}
    monkeypatch.setattr(suite_main, "compute", lambda cfg: (json.loads(json.dumps(doc)), None))
    monkeypatch.setattr(figures, "draw", lambda *a, **k: [])
    cfg = _compose("tracking.enabled=false", f"suite.output={tmp_path}/suite.json", f"suite.figures_dir={tmp_path}/f")
    inner = suite_main.main
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__
    inner(cfg)
    written = (tmp_path / "suite.json").read_text()
    assert "timings" not in written and "12.5" not in written and json.loads(written) == {"datasets": {}, "cost": {}}
