"""Secrets and races: redaction by shape (and what it must keep), Hydra's run folder holds no
secret, concurrent first runs on a new MLflow store, atomic DVC stage files, no timings in suite.json."""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import string
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir
from test_judges_servers import reply_json

from src.io import config
from src.io import files as fsutil
from src.io.config import thaw
from src.mlops import redact, store
from src.mlops import tracking as track
from src.present import stagefiles
from src.studies import simulate
from src.studies.checked import check_config

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
    "jwt": "eyJhbGciOiJIUzI1NiJ9."
    + base64.urlsafe_b64encode(b'{"sub":"1234567890"}').decode().rstrip("=")
    + "."
    + rnd(43, ALNUM + "-_"),
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
    assert redact.scrub({"judge": {"model": value, "list": [value]}}, secrets=[]) == {
        "judge": {"model": value, "list": [value]}
    }


@pytest.mark.parametrize(
    "key",
    [
        "git_commit",
        "mlflow.source.git.commit",
        "revision",
        "sha",
        "sha256",
        "commit",
        "hash",
        "digest",
        "md5",
        "verdict_table_sha256",
        "balanced_set_sha256",
        "run_id",
        "parentRunId",
        "stacker_uri",
    ],
)
def test_values_under_hash_declaring_keys_keep_their_hashes(key):
    value = HEX32 if key == "md5" else HEX64 if "256" in key else HEX40
    value = f"/tmp/x/mlruns/raim/{HEX32}/artifacts/stacker" if key == "stacker_uri" else value
    assert redact.scrub({key: value}, secrets=[]) == {key: value}
    assert redact.scrub({key: [value, f"sha256:{HEX64}"]}, secrets=[]) == {key: [value, f"sha256:{HEX64}"]}
    # … but a provider key shape is redacted there too
    assert redact.scrub({key: FAKE_ANTHROPIC}, secrets=[]) == {key: "***"}


def test_secret_key_names_and_lookalikes():
    secret = [
        "HF_TOKEN",
        "accessToken",
        "db_password",
        "PGPASSWORD",
        "client_secret",
        "x-api-key",
        "apiKey",
        "auth",
        "ANTHROPIC_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "private_key",
        "refresh_token",
        "passphrase",
    ]
    plain = [
        "max_tokens",
        "tokenizer",
        "tokens_per_item",
        "author",
        "SSH_AUTH_SOCK",
        "token_file",
        "XAUTHORITY",
        "auth_type",
        "password_path",
        "key",
        "model",
        "usd_per_mtok_in",
    ]
    assert [k for k in secret if not redact.secret_key(k)] == []
    assert [k for k in plain if redact.secret_key(k)] == []
    out = redact.scrub({k: "plain-value-123" for k in secret + plain}, secrets=[])
    assert {k for k, v in out.items() if v == "***"} == set(secret)
    assert redact.scrub(
        {"credentials": {"user": "bob", "pass": "hunter2"}, "tokens": None, "max_tokens": 5}, secrets=[]
    ) == {"credentials": "***", "tokens": None, "max_tokens": 5}


def test_named_pairs_env_values_and_url_passwords_in_free_text(monkeypatch):
    monkeypatch.setenv("GROQ_API_KEY", "plain-no-shape-value")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-agent-sock-path")
    text = (
        "python -m src.run +judge.api_key=hunter2 +db.password='two words' max_tokens=5 "
        "https://bob:s3cret@db.example.org/x?access_token=abc123&page=2 plain-no-shape-value /tmp/ssh-agent-sock-path"
    )
    out = redact.scrub_text(text)
    for gone in ("hunter2", "two words", "s3cret", "abc123", "plain-no-shape-value"):
        assert gone not in out
    for kept in (
        "+judge.api_key=***",
        "max_tokens=5",
        "https://***@db.example.org/x?access_token=***&page=2",
        "/tmp/ssh-agent-sock-path",
    ):
        assert kept in out


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        ("roster=paper",),
        ("roster=cpu",),
        ("roster=paper", "frame=claim"),
        ("roster=cpu", "frame=def_on"),
        ("roster=paper", f"roster.members.0.backend.revision={HEX40}"),
    ],
)
def test_nothing_in_the_composed_default_config_is_redacted(overrides):
    data = thaw(check_config(_compose(*overrides)).composed)
    assert redact.scrub(data, secrets=[]) == data
    assert config.flatten(redact.scrub(data, secrets=[])) == config.flatten(data)


def test_start_run_keeps_the_git_commit_and_redacts_user_tags(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for k, v in QUIET.items():
        monkeypatch.setenv(k, v)
    try:
        with (
            store.quiet_mlflow(),
            track.start_run(
                check_config(_compose("roster=cpu")), "test", tags={"note": SECRETS["groq"], "model_sha256": HEX64}
            ) as run,
        ):
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


SERVED_KEY = "roster.members.0.backend.api_key"
"""The override that gives conf/roster/openai_server.yaml's served judge its key: the one place a composed config
legitimately holds a secret (every other group refuses a key it does not know, ``+judge.api_key`` included)."""


@pytest.mark.parametrize("mode", ["run", "multirun"])
@pytest.mark.slow
def test_hydra_run_folder_holds_no_secret(tmp_path, small_verdicts, mode):
    env = {**os.environ, **QUIET, "RAIM_HYDRA_DIR": str(tmp_path / "hydra")}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = [
        sys.executable,
        "-m",
        "src.run",
        *(["-m"] if mode == "multirun" else []),
        f"verdicts={small_verdicts}",
        "analysis=fast",
        "analysis.n_boot=50",
        "tracking.enabled=false",
        f"output={tmp_path}/r.json",
        "roster=openai_server",  # a served judge's key: where a config holds a secret (its roster member's api_key)
        f"{SERVED_KEY}={FAKE_ANTHROPIC}",
    ]
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    # a single run writes the named output (and its run folder); a sweep job only its own folder
    results = tmp_path / "r.json" if mode == "run" else next((tmp_path / "hydra" / "multirun").glob("*/0/results.json"))
    assert results.is_file() and any(f.name.endswith(".log") for f in files)
    assert [str(f) for f in files if FAKE_ANTHROPIC.encode() in f.read_bytes()] == []
    saved = list((tmp_path / "hydra").rglob(".hydra/config.yaml"))  # the record of the run stays, scrubbed
    assert len(saved) == 1 and "api_key: '***'" in saved[0].read_text()
    assert f"{SERVED_KEY}=***" in saved[0].with_name("overrides.yaml").read_text()
    if mode == "multirun":
        sweep = next((tmp_path / "hydra" / "multirun").iterdir())
        assert (sweep.stat().st_mode & 0o777) == 0o700 and f"{SERVED_KEY}=***" in (sweep / "multirun.yaml").read_text()


# -------------------------------------------------------------------------- concurrent runs on a new store

CHILD = r"""
import sys, time
from pathlib import Path
import mlflow
from hydra import compose, initialize_config_dir

from src.mlops import store
from src.mlops import tracking as track
from src.studies.checked import check_config
tmp = Path(sys.argv[1])
with initialize_config_dir(config_dir=str(Path.cwd() / "conf"), version_base=None):
    cfg = compose(config_name="config", overrides=[f"tracking.uri=sqlite:///{tmp}/new.db"])
(tmp / f"ready{sys.argv[2]}").touch()
while not (tmp / "go").exists():  # everyone imported: start together
    time.sleep(0.005)
with store.quiet_mlflow():
    store.setup(check_config(cfg).tracking)
    with mlflow.start_run():
        mlflow.log_metric("x", 1.0)
"""


@pytest.mark.slow
def test_concurrent_first_runs_on_a_new_store_all_succeed(tmp_path):
    """Without :func:`src.mlops.store.store_lock` this fails nearly every time (N=3): alembic's "Online migration expected
    to match one row when updating … in 'alembic_version'; 0 found" or sqlite "database is locked"."""
    import mlflow

    n = 3
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(QUIET)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), str(i)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    deadline = time.monotonic() + 300
    while (
        sum((tmp_path / f"ready{i}").exists() for i in range(n)) < n
        and all(p.poll() is None for p in procs)
        and time.monotonic() < deadline
    ):
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
    ds = {
        "n": 100,
        "comparators": {
            "stacked": {m: est(kappa) for m in ("kappa", "bacc", "f1")},
            "best_cv": {"kappa": est(kappa - 0.05)},
        },
        "deltas": {"best_cv": {"kappa": {**est(0.05), "call": "win"}}},
        "admissibility": {"admissible": True, "phi_bar": 0.1, "members_at_kappa0": 0},
        "stacker": {"beta_mean": {"a": 1.0, "b": kappa}, "beta_full": {"a": 1.1, "b": kappa}},
    }
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
    assert (
        json.loads(metrics.read_text())["sim"]["stacked"]["kappa"] == 0.7 and (metrics.stat().st_mode & 0o777) == 0o644
    )


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


# ------------------------------------------------------------------- secrets never resolved into a written file

PLANTED_ENV = {
    "RAIM_OPENAI_API_KEY": "raimkey-" + rnd(24),
    "RAIM_OPENAI_BASE_URL": "http://bob:urlpw" + rnd(12) + "@127.0.0.1:9/v1",
    "RAIM_OPENAI_MODEL": "planted-model",
    "MY_SERVER_TOKEN": "mytok" + rnd(20),
}


def _planted(env: dict) -> list[str]:
    """The secret parts of the planted values (the URL's password, not its host)."""
    return [env["RAIM_OPENAI_API_KEY"], env["RAIM_OPENAI_BASE_URL"].split(":")[2].split("@")[0], env["MY_SERVER_TOKEN"]]


@pytest.mark.parametrize("writer", ["src.track params", "dvc exp run -S"])
def test_params_yaml_keeps_environment_references_unresolved(tmp_path, monkeypatch, writer):
    """params.yaml (committed) holds ``${oc.env:…}`` for the key and the base URL, whoever writes it: RAIM's
    ``python -m src.track params`` or DVC's own composition (what ``dvc exp run -S roster=…`` runs); a secret
    an override reads from the environment is not written either."""
    from dvc.utils.hydra import compose_and_dump

    for k, v in PLANTED_ENV.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "params.yaml"
    overrides = ["roster=openai_server"]
    if writer == "dvc exp run -S":
        compose_and_dump(out, str(ROOT / "conf"), None, "config", "", overrides)
    else:
        config.write_params(out, [*overrides, "+judge.headers.x-api-key=${oc.env:MY_SERVER_TOKEN,null}"])
        with pytest.raises(config.RaimError, match=r"MY_SERVER_TOKEN.*give such a reference a default"):
            config.write_params(tmp_path / "p2.yaml", ["+judge.headers.x-api-key=${oc.env:MY_SERVER_TOKEN}"])
    text = out.read_text()
    assert [s for s in _planted(PLANTED_ENV) if s in text] == []
    backend = yaml.safe_load(text)["roster"]["members"][0]["backend"]
    assert backend["api_key"] == "${oc.env:RAIM_OPENAI_API_KEY,null}"
    assert backend["base_url"] == "${oc.env:RAIM_OPENAI_BASE_URL,http://localhost:8000/v1}"
    if writer == "src.track params":  # no value of this machine's environment is committed
        assert backend["model"] == "default" and "planted-model" not in text
        assert yaml.safe_load(text)["judge"]["headers"]["x-api-key"] is None


SHORT = "qwertyui"  # a credential below every shape rule: only the name it is given under marks it


@pytest.mark.parametrize("scheme", ["Bearer", "Basic", "Token", "Digest", "bearer"])
@pytest.mark.parametrize("form", ["override", "override list", "free text", "header line", "launcher line"])
def test_a_secret_named_pair_whose_value_is_a_scheme_and_a_credential(scheme, form):
    """``Authorization=Bearer <token>``: the value of a secret-named pair is the scheme word *and* the credential,
    however short, as one override, in Hydra's override list, in free text and as a header line."""
    override = f"+judge.headers.Authorization={scheme} {SHORT}"
    text = {
        "override": override,
        "override list": str([override, "analysis=fast"]),
        "free text": f"calling with Authorization={scheme} {SHORT} now",
        "header line": f"Authorization: {scheme} {SHORT}",
        "launcher line": f"\t#0 : analysis=fast {override}",
    }
    out = redact.scrub_text(text[form], secrets=[])
    assert SHORT not in out and "Authorization" in out and redact.REDACTED in out


@pytest.mark.parametrize(
    "override",
    [
        "+judge.api_key=[ab1,cd2]",
        "+judge.api_key=two words",
        "+db.password='a b c'",
        "~judge.token=x1",
        "+judge.api_key=",
    ],
)
def test_a_whole_override_under_a_secret_name_loses_its_whole_value(override):
    key, value = override.split("=", 1)
    assert redact.scrub([override], secrets=[]) == [f"{key}=***" if value else override]


def test_the_shells_working_directory_is_not_taken_for_a_password(monkeypatch, tmp_path):
    """``PWD`` reads as "password" by the name rule, yet it is the shell's working directory: every path in a
    message would lose its checkout folder."""
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.setenv("OLDPWD", str(tmp_path / "before"))
    monkeypatch.setenv("DB_PWD", "hunter2-db")
    text = f"expected raw file is absent from {tmp_path}/raw and {tmp_path}/before; db hunter2-db"
    assert redact.scrub_text(text) == f"expected raw file is absent from {tmp_path}/raw and {tmp_path}/before; db ***"


def test_override_secrets_are_redacted_wherever_they_appear_later():
    vals = redact.override_secrets(
        ["+judge.api_key=sekrit-one,sekrit-two", "analysis=fast", f"+judge.headers.Authorization=Bearer {SHORT}"]
    )
    assert {"sekrit-one", "sekrit-two", SHORT} <= set(vals) and "fast" not in vals
    redact.add_secrets(vals)
    assert redact.scrub_text(f"job 2 used sekrit-two and {SHORT}") == "job 2 used *** and ***"


def test_one_line_errors_and_debug_tracebacks_are_scrubbed(monkeypatch, capsys):
    from src.core import errors

    @errors.one_line
    def fail():
        raise errors.RaimError(f"server said no to Authorization=Bearer {SHORT} at https://bob:pw12345@h/v1")

    monkeypatch.delenv("RAIM_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit):
        fail()
    err = capsys.readouterr().err
    assert err.startswith("error: server said no") and SHORT not in err and "pw12345" not in err
    with pytest.raises(SystemExit):  # an argument error quotes the arguments
        errors.ArgumentParser(prog="p").parse_args([f"+judge.headers.Authorization=Bearer {SHORT}"])
    err = capsys.readouterr().err
    assert err.startswith("error: p: unrecognized arguments: +judge.headers.Authorization=***") and SHORT not in err
    monkeypatch.setenv("RAIM_DEBUG", "1")
    with pytest.raises(errors.RaimError) as e:
        fail()
    assert SHORT not in str(e.value) and "pw12345" not in str(e.value) and "https://***@h/v1" in str(e.value)


HYDRA_CASES = {  # what goes wrong → the overrides (and env) of a src.run that prints it; KEY= is the served key
    "composition error": (["judge.api_key=SECRET"], {}, "error: override 'judge.api_key=***': judge has no key"),
    "refused key": (
        ["+judge.api_key=SECRET"],
        {},
        "error: config.yaml: judge: unknown key 'api_key' for JudgeSettings",
    ),
    "refused header": (
        ["+roster.members.0.backend.headers.Authorization=Bearer SECRET"],
        {},
        "unknown key 'headers' for OpenAICompatBackend",
    ),
    "job error": (["KEY=SECRET", "analysis.seed=abc"], {}, "error: conf/analysis/fast.yaml: seed='abc' is not int"),
    "job error, HYDRA_FULL_ERROR": (["KEY=SECRET", "analysis.seed=abc"], {"HYDRA_FULL_ERROR": "1"}, "Traceback"),
    "sweep job error": (["-m", "KEY=SECRET,SECRET2", "analysis.seed=abc"], {}, "Launching 2 jobs"),
    "bad command line": (["KEY=SECRET,SECRET2", "-m", "x=1"], {}, "unrecognized arguments"),
    "RAIM error, RAIM_DEBUG": (["KEY=SECRET", "analysis.kappa_floor=2"], {"RAIM_DEBUG": "1"}, "FloorError"),
    "--info": (["KEY=SECRET", "--info"], {}, "api_key: ***"),
    "--cfg job": (["KEY=SECRET", "--cfg", "job"], {}, "api_key: ***"),
}


@pytest.mark.parametrize("case", HYDRA_CASES)
@pytest.mark.slow
def test_nothing_hydra_prints_holds_an_override_secret(tmp_path, small_verdicts, case):
    overrides, extra, expect = HYDRA_CASES[case]
    secret = "hydrasecret" + rnd(12)
    env = {**os.environ, **QUIET, "RAIM_HYDRA_DIR": str(tmp_path / "hydra"), **extra}
    for k in ("RAIM_DEBUG", "HYDRA_FULL_ERROR"):
        env.setdefault(k, "") if k in extra else env.pop(k, None)
    args = [o.replace("SECRET", secret).replace("KEY=", f"{SERVED_KEY}=") for o in overrides]
    flags = ["-m"] if args[0] == "-m" else []
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            *flags,
            f"verdicts={small_verdicts}",
            "analysis=fast",
            "analysis.n_boot=20",
            "tracking.enabled=false",
            "roster=openai_server",
            *args[len(flags) :],
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert expect in out, out[-2000:]
    assert secret not in out
    assert [str(f) for f in tmp_path.rglob("*") if f.is_file() and secret.encode() in f.read_bytes()] == []


# ------------------------------------------------ every command that writes or logs, with keys planted everywhere


class JudgeAPI(BaseHTTPRequestHandler):
    """A stand-in OpenAI-compatible chat server: a verdict per prompt (its CRC's parity); records each request's
    ``Authorization`` header."""

    auth: list[str] = []

    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).auth.append(self.headers.get("authorization"))
        no = zlib.crc32(body["messages"][-1]["content"].encode()) % 3 == 0
        top = [{"token": "No", "logprob": -0.1 if no else -3.0}, {"token": "Yes", "logprob": -3.0 if no else -0.1}]
        reply_json(
            self,
            {
                "object": "chat.completion",
                "model": body["model"],
                "usage": {"prompt_tokens": 9},
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": top[0]["token"]},
                        "logprobs": {"content": [{**top[0], "top_logprobs": top}]},
                    }
                ],
            },
        )


def _dump(db: Path) -> bytes:
    """The MLflow store as SQL text (what ``sqlite3 mlflow.db .dump`` prints)."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return "\n".join(con.iterdump()).encode()
    finally:
        con.close()


def _contents(files: list[Path]) -> Iterator[tuple[str, bytes]]:
    """Each file's bytes, one at a time (the worktree's venv is gigabytes); a file gone since it was listed (a
    test on the other worker cleaning up under ``pytest -n 2``) held nothing of this test's."""
    for f in files:
        try:
            yield str(f), f.read_bytes()
        except FileNotFoundError:
            continue


@pytest.mark.slow  # every command that writes or logs, then a grep of everything: ~3 min here
def test_no_planted_key_reaches_any_file_or_output_of_any_command(tmp_path):
    """Unique fake keys in every place the docs name — the environment (RAIM_OPENAI_API_KEY, OPENAI_API_KEY,
    ANTHROPIC_API_KEY, HF_TOKEN), overrides (the served judge's ``roster.members.0.backend.api_key=…``, a swept
    one, a short one below every shape rule), the base URL's password, and the overrides a strict config refuses
    (``+judge.api_key=…``, ``Authorization=Bearer …``: one line that echoes neither) — through every command that
    writes or logs: ``src.run`` (a single run that judges through the served judge, a ``-m`` sweep, a refused
    run), ``src.track params``, the registry's ``log-panel``, ``src.predict`` on the panel model, and the studies
    on the served verdicts. Then the whole worktree, the Hydra folders, the MLflow store (its raw bytes and its
    SQL dump), every artifact (pickles included, raw bytes) and everything printed: no key anywhere. The keys did
    reach the server, each as it should."""
    import mlflow

    tag = rnd(6)
    keys = {
        name: f"{name.lower()[:6]}{tag}{rnd(14)}"
        for name in (
            "RAIM_OPENAI_API_KEY",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "HF_TOKEN",
            "OVERRIDE",
            "SWEPT",
            "BEARER",
            "URLPW",
            "REFUSED",
        )
    }
    keys["BEARER"] = "b" + tag  # shorter than every shape rule
    srv = ThreadingHTTPServer(("127.0.0.1", 0), JudgeAPI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    JudgeAPI.auth = []
    host = f"127.0.0.1:{srv.server_address[1]}"
    store = tmp_path / "store"
    store.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("RAIM_DEBUG", "HYDRA_FULL_ERROR")},
        **QUIET,
        "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",
        "RAIM_HYDRA_DIR": str(tmp_path / "hydra"),
        **{k: keys[k] for k in ("RAIM_OPENAI_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "HF_TOKEN")},
        "RAIM_OPENAI_BASE_URL": f"http://{host}/v1",
        "RAIM_OPENAI_MODEL": "planted-model",
    }
    url_env = {**env, "RAIM_OPENAI_BASE_URL": f"http://bob:{keys['URLPW']}@{host}/v1"}
    url_env.pop("RAIM_OPENAI_API_KEY")  # a password in the URL, and no key beside it
    printed: list[str] = []

    def run(*args: str, environ: dict = env, rc: int = 0) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [sys.executable, "-m", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600
        )
        printed.append(p.stdout + p.stderr)
        assert p.returncode == rc, (args, p.stderr[-3000:])
        return p

    served_key = f"{SERVED_KEY}={keys['BEARER']}"  # the served judge's key, given on the command line
    refused = [f"+judge.api_key={keys['REFUSED']}", f"+judge.headers.Authorization=Bearer {keys['REFUSED']}"]
    judged = [
        "roster=openai_server",
        "dataset=wice",
        "judge.per_dataset=60",
        "judge.compute=true",
        "analysis=fast",
        "analysis.n_boot=50",
        f"paths.tables_dir={tmp_path / 'tables'}",
    ]
    # runs that judge through the served judge: HTTP Basic from the URL, the Bearer key from the environment (half
    # the items), a sweep whose swept override key judges the rest; then a run its refused keys stop in one line
    run(
        "src.run",
        *judged,
        f"paths.cache_dir={tmp_path / 'cache1'}",
        f"output={tmp_path / 'results.json'}",
        environ=url_env,
    )
    basic = "Basic " + base64.b64encode(f"bob:{keys['URLPW']}".encode()).decode()
    assert set(JudgeAPI.auth) == {basic}
    run("src.run", *judged, f"paths.cache_dir={tmp_path / 'cache2'}", "judge.per_dataset=30")
    assert set(JudgeAPI.auth) == {basic, f"Bearer {keys['RAIM_OPENAI_API_KEY']}"}
    run(
        "src.run",
        "-m",
        *judged,
        f"paths.cache_dir={tmp_path / 'cache2'}",
        f"{SERVED_KEY}={keys['OVERRIDE']},{keys['SWEPT']}",
        "stacker.C=0.1,10",
    )
    assert set(JudgeAPI.auth) == {basic, *(f"Bearer {keys[k]}" for k in ("RAIM_OPENAI_API_KEY", "OVERRIDE"))}
    stop = run("src.run", *judged, f"paths.cache_dir={tmp_path / 'cache3'}", *refused, rc=2).stderr
    assert len(stop.splitlines()) == 1 and "error: config.yaml: judge: unknown keys 'api_key', 'headers'" in stop
    run(
        "src.track",
        "params",
        "roster=openai_server",
        served_key,
        "--out",
        str(tmp_path / "params.yaml"),
        environ={**url_env, "RAIM_OPENAI_API_KEY": keys["RAIM_OPENAI_API_KEY"]},
    )
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    try:
        runs = mlflow.search_runs(
            search_all_experiments=True,
            output_format="list",
            order_by=["start_time ASC"],
            filter_string="tags.kind = 'stacking' and tags.dataset = 'wice'",
        )
        stacker = next(r.data.tags["stacker_model_uri"] for r in runs if "stacker_model_uri" in r.data.tags)
    finally:
        mlflow.set_tracking_uri(None)
    panel = run(
        "src.registry",
        "log-panel",
        "--roster",
        "openai_server",
        "--stacker-uri",
        stacker,
        "--cache-dir",
        str(tmp_path / "cache2"),
    ).stdout.split()[2]
    items = tmp_path / "items.csv"
    pd.DataFrame(
        {
            "evidence": ["Paris is the capital of France."] * 2,
            "candidate": ["The capital is Paris.", "The capital is Lyon."],
        }
    ).to_csv(items, index=False)
    run(
        "src.predict",
        str(items),
        "--model-uri",
        panel,
        "--cache-dir",
        str(tmp_path / "pcache"),
        "--out",
        str(tmp_path / "pred.jsonl"),
        "--no-progress",
    )
    # the studies, on the sweep's served verdicts, with the served judge's key on the command line
    study_out = {
        "prevalence": ["prevalence.n_boot=5", "prevalence.n_draws=2", "prevalence.simulations=[]"],
        "monitor": [
            "monitor.evaluation.seeds=1",
            "monitor.replay.stable_items=400",
            "monitor.replay.changed_items=400",
        ],
        "noise": [
            "noise.types=[rf]",
            "noise.rates=[0,0.15]",
            "noise.draws=1",
            "noise.n_boot=20",
            "noise.simulation.enabled=false",
            "noise.stackers=[logreg]",
        ],
    }
    for study, shrink in study_out.items():
        run(
            f"src.{study}",
            "analysis=fast",
            *shrink,
            f"{study}.output={tmp_path / study}.json",
            f"{study}.figure={tmp_path / study}.png",
            *judged[:3],
            f"paths.cache_dir={tmp_path / 'cache2'}",
            served_key,
        )
    assert (tmp_path / "pred.jsonl").is_file() and (store / "mlflow.db").is_file()

    planted = list(keys.values())
    found = [(name, "printed") for name, k in keys.items() if any(k in out for out in printed)]
    files = [f for root in (tmp_path, ROOT) for f in root.rglob("*") if f.is_file() and ".git" not in f.parts]
    assert any(f.name == "python_model.pkl" for f in files) and any(f.name == "sweep_summary.csv" for f in files)
    blobs = itertools.chain(_contents(files), [("mlflow.db dump", _dump(store / "mlflow.db"))])
    found += [(name, where) for where, blob in blobs for name, k in keys.items() if k.encode() in blob]
    assert found == [], found
    assert len(planted) == len(set(planted))
