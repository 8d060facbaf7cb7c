"""MLflow tracking of RAIM's analyses: the ladder of §2 / Table 1, the §3.3 admissibility test and the
deployment decision of each dataset, one run per analysis and one nested run per dataset.

* Backend store: sqlite (``tracking.uri``, default ``sqlite:///mlflow.db`` at the repo root); the environment
  variable ``MLFLOW_TRACKING_URI`` wins. A relative sqlite path is made absolute against the repo root, so a
  run launched from anywhere (a DVC temp workspace, a Hydra job) lands in the same database.
* Artifacts: ``mlruns/`` next to the sqlite file (``<repo>/mlruns`` by default).
* :func:`start_run` opens a run (nested under an active parent, or under the sweep's parent in a Hydra
  multirun), tags it (:func:`choices`: kind, roster — or ``verdicts`` for a bring-your-own table —, dataset,
  frame, stacker, analysis, git commit; read off the config's values, so ``python -m src.run`` and the DVC
  stage tag alike) and logs the composed config as params, secrets scrubbed.
* :func:`log_analysis` logs one stacking/ladder analysis: a parent run, one nested child per dataset with
  κ/bacc/F1 and their intervals, paired deltas (calls as tags), β per member (metrics + CSV), admissibility
  coordinates, the decision (tags ``decision``, ``decision_member``, ``decision_reason``: :mod:`src.decide`),
  the params that set the analysis apart (:data:`DISTINGUISHING`: MLflow's Compare separates a sweep's runs),
  hashes of the inputs, and the fitted stacker as a pyfunc model (:mod:`src.serve`; this module imports it,
  never the reverse).

Secrets (:func:`scrub`, :func:`scrub_text`): applied to the composed config (params and ``config.yaml``), to the
tags of :func:`start_run` (user tags; RAIM's own ``git_commit`` sits under a hash key) and to JSON artifacts.
The hashes RAIM sets itself on dataset runs (``*_sha256``, ``stacker_model_uri``) are not scrubbed. Hydra's
own copies of the config are scrubbed too: conf/config.yaml turns Hydra's ``.hydra/`` off
(``hydra.output_subdir: null``) and :class:`ScrubHydraOutputs` writes it scrubbed instead; a sweep's
``multirun.yaml`` sits in a private (0700) folder and is rewritten scrubbed as each job starts.

* By key: the value under a secret-looking key is redacted whole (whatever its type). Key names are split
  into words (snake, kebab, dotted, camelCase): a word containing password/passwd/passphrase/secret/apikey/
  credential/privatekey, a word ending in ``token`` (``HF_TOKEN``, ``accessToken``; not ``max_tokens``, not
  ``tokenizer``), the words auth/authorization/bearer/cookie/pwd, or the pairs ``api key`` / ``private key`` /
  ``access key``; but not a key whose last word names where a secret lives rather than the secret
  (``SSH_AUTH_SOCK``, ``token_file``, ``password_path``, ``auth_type`` …).
* By value, everywhere (config values, nested lists, free text, URLs, tags): the values of secret-named
  environment variables; URL passwords (``https://user:***@host``); ``name=value`` pairs with a secret
  name (``+judge.api_key=…``, ``?access_token=…``); ``Bearer``/``Basic`` credentials (the scheme word is kept);
  and provider key shapes: ``sk-…`` (OpenAI, DeepSeek), ``sk-ant-…``, ``gsk_…``, ``AIza…``, ``hf_…``,
  ``ghp_…``/``github_pat_…``, ``glpat-…``, ``xox?-…``, ``AKIA…``/``ASIA…``, ``sk_live_…``, ``xai-…``, ``r8_…``
  and JWTs (``eyJ….….…``).
* By generic shape, except under a hash-declaring key: a run of 32+ hex digits (letters and digits mixed),
  and a 32+ character base64-like run (``[A-Za-z0-9+/_=-]``, no spaces) that mixes upper case, lower case and
  digits, has a separator-free stretch of 12+ characters switching character class often, and is not mostly
  words (a path, a model id such as ``meta-llama/Meta-Llama-3-8B-Instruct`` or ``HuggingFaceTB/SmolLM2-135M``
  is kept). This heuristic catches ~95-99 % of random tokens: name a secret's key or environment variable as
  one, never rely on the shape alone.
* Hashes are not secrets: under a key declaring a hash or an id (a word revision/rev/sha/sha1/sha256/sha512/
  commit/hash/digest/md5/checksum/etag, ``run_id``/``model_id``/``experiment_id``, or an MLflow location:
  ``model_uri``/``stacker_uri``/``artifact_uri``), and in MLflow URIs (``runs:/<id>``, ``models:/m-<id>``),
  long hex and base64 runs are kept (git commits, ``*_sha256`` tags, a pinned ``revision:`` of conf/roster,
  ``stacker_uri=/…/mlruns/raim/<run id>/artifacts/stacker``). The provider shapes above are redacted there too.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from src.core.errors import ArgumentParser, RaimError, one_line
from src.io.files import atomic_write_text, to_json
from src.io.paths import CONF_DIR, ROOT

DEFAULT_URI = "sqlite:///mlflow.db"
PARENT_ENV = "RAIM_MLFLOW_PARENT_RUN_ID"
REDACTED = "***"

# ------------------------------------------------------------------------------------------------- secrets
# The rule is the module docstring's (Secrets).

_KEY_WORD = re.compile(r"(?:[A-Z]+(?![a-z])|[A-Z]?[a-z]+)[0-9]*|[0-9]+")  # sha256, md5: one word
_SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "apikey", "credential", "privatekey")
_SECRET_WORDS = frozenset({"auth", "authorization", "bearer", "cookie", "pwd"})
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})
_WHERE_WORDS = frozenset({"sock", "socket", "file", "path", "dir", "type", "method", "mode", "url", "uri", "host"})
_HASH_WORDS = frozenset({"revision", "rev", "sha", "sha1", "sha256", "sha512", "commit", "hash", "digest", "md5",
                         "checksum", "etag"})
_ID_PAIRS = frozenset({("run", "id"), ("model", "id"), ("experiment", "id"), ("model", "uri"), ("stacker", "uri"),
                       ("artifact", "uri")})


def _key_words(name: str) -> list[str]:
    return [w.lower() for w in _KEY_WORD.findall(str(name))]


def _pairs(words: list[str]) -> set[tuple[str, str]]:
    return set(zip(words, words[1:]))


def secret_key(name: str) -> bool:
    """Whether a config key or environment variable name looks like it holds a secret (the rule above)."""
    words = _key_words(name)
    if not words or words[-1] in _WHERE_WORDS:
        return False
    return (any(p in w for w in words for p in _SECRET_PARTS) or any(w.endswith("token") for w in words)
            or bool(_SECRET_WORDS.intersection(words)) or bool(_SECRET_PAIRS & _pairs(words)))


def hash_key(name: str) -> bool:
    """Whether a key declares a hash or an id (``git_commit``, ``*_sha256``, ``revision``, ``run_id``)."""
    words = _key_words(name)
    return bool(_HASH_WORDS.intersection(words)) or bool(_ID_PAIRS & _pairs(words))


_B = r"(?<![A-Za-z0-9])"  # a token starts at a word boundary (``task-…`` holds no ``sk-`` key)
_PROVIDER = re.compile(_B + r"(?:sk-ant-[A-Za-z0-9_-]{8,}|gsk_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_-]{35}"
                       r"|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}"
                       r"|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"
                       r"|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}|xai-[A-Za-z0-9]{40,}|r8_[A-Za-z0-9]{30,}"
                       r"|eyJ[\w-]{10,}\.[\w-]{10,}\.[\w-]{10,})")
_SK = re.compile(_B + r"sk-(?:proj-|svcacct-|admin-)?(?P<body>[A-Za-z0-9_-]{20,})")
_SCHEME = re.compile(r"(?i)\b(?P<scheme>bearer|basic)(?P<sp>\s+)(?P<tok>[A-Za-z0-9._~+/=-]{8,})")
_NAMED = re.compile(r"(?P<key>[A-Za-z_][\w.-]*)(?P<eq>\s*=\s*)(?P<val>'[^']*'|\"[^\"]*\"|[^\s&,;'\"]+)")
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^/@:\s]+)(:(?P<pw>[^/@\s]+))?@", re.I)
_LONG_HEX = re.compile(_B + r"(?<!runs:/)(?<!models:/m-)[0-9A-Fa-f]{32,}(?![A-Za-z0-9])")
_LONG_B64 = re.compile(r"(?<![A-Za-z0-9+/_=-])(?<!runs:/)(?<!models:/m-)[A-Za-z0-9+/_=-]{32,}")
_WORDY = re.compile(r"[a-z]{3,}|[A-Z]{3,}|[0-9]{4,}")


def _class_changes(s: str) -> float:
    """Share of neighbouring letters/digits that switch class (upper, lower, digit): ~0.6 in a random token."""
    cls = [c.isupper() - c.isdigit() for c in s if c.isalnum()]
    return sum(a != b for a, b in zip(cls, cls[1:])) / max(len(cls) - 1, 1)


def _random_looking(run: str) -> bool:
    """A base64-like run that mixes upper, lower and digits, is not mostly words, numbers and acronyms, and has a
    separator-free stretch of 12+ characters that switches character class often."""
    if not (re.search("[A-Z]", run) and re.search("[a-z]", run) and re.search("[0-9]", run)):
        return False
    if sum(map(len, _WORDY.findall(run))) >= 0.6 * sum(c.isalnum() for c in run):
        return False
    return any(len(s) >= 12 and _class_changes(s) >= 0.35 for s in re.split(r"[/_-]", run))


def _sk_key(m: re.Match) -> str:
    body = m["body"]
    keyish = (re.search("[0-9]", body) and re.search("[A-Za-z]", body)
              and max(map(len, re.split(r"[_-]", body))) >= 16)  # not ``sk-learn-model-version-1``
    return REDACTED if keyish else m[0]


def _scheme_credential(m: re.Match) -> str:
    tok = m["tok"]
    credential = re.search("[0-9]", tok) or (len(tok) >= 16 and re.search("[A-Z]", tok) and re.search("[a-z]", tok))
    return f"{m['scheme']}{m['sp']}{REDACTED}" if credential else m[0]


def _named(m: re.Match) -> str:
    return f"{m['key']}{m['eq']}{REDACTED}" if secret_key(m["key"]) else m[0]


def _secret_env_values() -> list[str]:
    """Values of environment variables whose names look secret (ANTHROPIC_API_KEY, HF_TOKEN, …)."""
    vals = {v for k, v in os.environ.items() if secret_key(k) and v and len(v) >= 6}
    return sorted(vals, key=len, reverse=True)


def scrub_text(text: str, secrets: Iterable[str] | None = None, by_shape: bool = True) -> str:
    """Redact secrets in free text: known env secrets, URL passwords, secret-named ``name=value`` pairs,
    ``Bearer``/``Basic`` credentials, provider key shapes and (``by_shape``) long hex / base64-like tokens."""
    secrets = _secret_env_values() if secrets is None else secrets
    for s in secrets:
        text = text.replace(s, REDACTED)
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _NAMED.sub(_named, text)
    text = _SCHEME.sub(_scheme_credential, text)
    text = _SK.sub(_sk_key, _PROVIDER.sub(REDACTED, text))
    if by_shape:
        text = _LONG_HEX.sub(lambda m: REDACTED if re.search("[0-9]", m[0]) and re.search("[A-Fa-f]", m[0])
                             else m[0], text)
        text = _LONG_B64.sub(lambda m: REDACTED if _random_looking(m[0]) else m[0], text)
    return text


def scrub(obj: Any, secrets: Iterable[str] | None = None, key: str = "") -> Any:
    """A copy of a JSON-like object with secret-keyed values and secret-looking values redacted (the rule above:
    ``key`` is the key the object sits under; a hash-declaring key keeps its long hex/base64 values)."""
    secrets = _secret_env_values() if secrets is None else list(secrets)
    if key and secret_key(key) and obj not in (None, "", False, [], {}):
        return REDACTED
    if isinstance(obj, Mapping):
        return {k: scrub(v, secrets, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, secrets, key) for v in obj]
    if isinstance(obj, str):
        return scrub_text(obj, secrets, by_shape=not hash_key(key))
    return obj


class ScrubHydraOutputs(Callback):
    """Hydra callback (conf/config.yaml ``hydra.callbacks``): Hydra's own copies of the config, scrubbed.

    Hydra writes every composed value in plain text (0644) to ``<run dir>/.hydra/{config,hydra,overrides}.yaml``
    and, in a sweep, to ``<sweep dir>/multirun.yaml``. With ``hydra.output_subdir: null`` Hydra writes no
    ``.hydra/``; this callback writes the same three files into ``subdir`` with :func:`scrub` applied (so the
    record of a run stays, without its secrets; ``subdir=null`` writes none). ``multirun.yaml`` cannot be
    suppressed: the sweep folder is created private (0700) and the file is rewritten scrubbed as each job starts.
    """

    def __init__(self, subdir: str | None = ".hydra") -> None:
        self.subdir = subdir

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True, mode=0o700)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.types import RunMode

        def save(data: Any, path: Path) -> None:
            atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.create(scrub(data))))

        data = OmegaConf.to_container(config, resolve=False)
        hydra_node = data.pop("hydra")
        if self.subdir:
            out = Path(str(config.hydra.runtime.output_dir)) / self.subdir
            save(data, out / "config.yaml")
            save({"hydra": hydra_node}, out / "hydra.yaml")
            save(hydra_node["overrides"]["task"], out / "overrides.yaml")
        sweep = Path(str(config.hydra.sweep.dir)) / "multirun.yaml"
        if config.hydra.mode == RunMode.MULTIRUN and sweep.is_file():
            save(OmegaConf.to_container(OmegaConf.load(sweep), resolve=False), sweep)


# ---------------------------------------------------------------------------------------------- config

def tracking_uri(cfg: DictConfig | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``cfg.tracking.uri``; a relative sqlite path is made absolute
    against the repository root (never against the current directory)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or (
        OmegaConf.select(cfg, "tracking.uri", default=None) if cfg is not None else None) or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///"):]
        if rel and rel != ":memory:":
            return "sqlite:///" + str((ROOT / rel).resolve())
    if "://" not in uri and not uri.startswith("databricks"):
        return Path(uri).resolve().as_uri() if not Path(uri).is_absolute() else Path(uri).as_uri()
    return uri


def artifact_root(uri: str, experiment: str = "raim") -> str | None:
    """``mlruns/<experiment>`` beside the sqlite database (None for a server: it decides)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlruns" / re.sub(r"[^\w.-]", "_", experiment)).as_uri()
    return None


def to_container(cfg: DictConfig) -> dict:
    """The composed config as plain data (interpolations resolved where possible; no ``hydra`` node)."""
    if not isinstance(cfg, DictConfig):
        return dict(cfg)
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # e.g. a ${hydra:...} interpolation outside a Hydra app
        data = OmegaConf.to_container(cfg, resolve=False)
    data.pop("hydra", None)
    return data


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Dotted keys → string values (lists as JSON), as MLflow params."""
    out: dict[str, str] = {}
    if isinstance(data, Mapping):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        if not data and prefix:
            out[prefix[:-1]] = "{}"
        return out
    value = json.dumps(data, default=str) if isinstance(data, (list, tuple)) else str(data)
    out[prefix[:-1]] = value[:6000]
    return out


NAMED_GROUPS = ("roster", "dataset", "frame")  # named by their own ``name`` value
VALUE_GROUPS = ("stacker", "analysis", "suite")  # named by the conf/<group> option whose values they hold


def group_option(group: str, name: str) -> DictConfig:
    """Load one option of a config group by name (e.g. a dataset's frame when ``frame=auto``)."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no config {group}/{name}.yaml under {CONF_DIR}")
    return OmegaConf.load(path)


def composed_option(group: str, name: str) -> DictConfig:
    """conf/<group>/<name>.yaml with its defaults list (other options of the group) merged first, as Hydra does."""
    node = group_option(group, name)
    defaults = list(node.pop("defaults", None) or []) or ["_self_"]
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create()
    for d in defaults:
        merged = OmegaConf.merge(merged, node if d == "_self_" else composed_option(group, d))
    return merged


@functools.lru_cache(maxsize=None)
def _option(group: str, name: str) -> tuple[tuple[str, str], ...]:
    """:func:`composed_option`, flattened."""
    return tuple(sorted(flatten(OmegaConf.to_container(composed_option(group, name), resolve=False)).items()))


def option_name(group: str, values: Mapping) -> str | None:
    """The conf/<group> option whose composed values ``values`` hold (``logreg``), else the nearest one with the
    values that differ (``logreg (C=0.1)``); None when the group has no options. Read off the values, so the
    same under ``python -m src.run`` and the DVC stage (params.yaml has no Hydra group choices)."""
    flat = flatten(values)
    diffs = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        opt = dict(_option(group, path.stem))
        diffs[path.stem] = [k for k in sorted(set(flat) | set(opt)) if flat.get(k) != opt.get(k)]
    if not diffs:
        return None
    best = min(diffs, key=lambda n: len(diffs[n]))
    changed = ", ".join(f"{k}={flat.get(k, 'unset')}" for k in diffs[best])
    return f"{best} ({changed})" if changed else best


def byo_verdicts(cfg: DictConfig | Mapping) -> str | None:
    """The bring-your-own verdict table a run analyses (``verdicts=PATH``): no roster judged it."""
    v = OmegaConf.select(cfg, "verdicts", default=None) if isinstance(cfg, DictConfig) else cfg.get("verdicts")
    return str(v) if v else None


def choices(cfg: DictConfig) -> dict[str, str]:
    """What a run analysed, as tags read off the config's values: the roster (none for a bring-your-own verdict
    table: ``verdicts`` instead), the dataset(s) and the frame by name; the stacker, analysis and suite settings
    by the conf option they match (:func:`option_name`)."""
    data = to_container(cfg)
    picked: dict[str, str] = {}
    for group in NAMED_GROUPS + VALUE_GROUPS:
        node = data.get(group)
        if not isinstance(node, Mapping):
            continue
        name = node.get("name") if group in NAMED_GROUPS else option_name(group, node)
        if name is None and node.get("_target_"):
            name = str(node["_target_"]).rsplit(".", 1)[-1]
        if name is not None:
            picked[group] = str(name)
    if byo_verdicts(data):
        picked.pop("roster", None)
        picked["verdicts"] = byo_verdicts(data)
    ds = (data.get("dataset") or {}).get("datasets")
    if ds and picked.get("dataset") == "all":
        picked["datasets"] = ",".join(ds)
    return picked


def git_commit() -> tuple[str | None, bool | None]:
    """HEAD's commit and whether the working tree differs from it (None when not in a git checkout)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=20).stdout.strip() != ""
        return sha, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


# ---------------------------------------------------------------------------------------------- hashes

def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_tree(paths: Iterable[str | Path]) -> str | None:
    """One hash over files (directories walked in sorted order): relative path and content of each."""
    h, seen = hashlib.sha256(), False
    for root in paths:
        root = Path(root)
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root] * root.is_file()
        for f in files:
            seen = True
            h.update(str(f.relative_to(root.parent)).encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest() if seen else None


def table_hash(table) -> str:
    """Content hash of a verdict table (the on-disk contract, rows in their order)."""
    return hashlib.sha256(table.to_frame().to_csv(index=False).encode()).hexdigest()


def input_hashes(cfg: DictConfig, table, dataset: str | None = None) -> dict[str, str]:
    """Hashes of what an analysis read: the verdict table, the balanced set(s) and the verdict cache."""
    out = {"verdict_table_sha256": table_hash(table)}
    if OmegaConf.select(cfg, "verdicts", default=None):
        p = Path(cfg.verdicts)
        if p.is_file():
            out["verdicts_file_sha256"] = sha256_file(p)
        return out
    names = [dataset] if dataset else list(dict.fromkeys(table.items["dataset"]))
    ddir = Path(OmegaConf.select(cfg, "paths.datasets_dir", default="datasets"))
    bal = sha256_tree(ddir / f"{n}.jsonl" for n in names)
    if bal:
        out["balanced_set_sha256"] = bal
    cdir = Path(OmegaConf.select(cfg, "paths.cache_dir", default="verdicts/cache"))
    members = [str(m) for m in table.members]
    if table.frontier_name:
        members.append(table.frontier_name)
    cache = sha256_tree(cdir / m for m in members)
    if cache:
        out["verdict_cache_sha256"] = cache
    return out


# ---------------------------------------------------------------------------------------------- runs

_BAD_NAME = re.compile(r"[^\w\-. /]")


def metric_name(*parts: str) -> str:
    """An MLflow-legal metric name (alphanumerics, ``_ - . /`` and spaces)."""
    return _BAD_NAME.sub("_", "/".join(str(p) for p in parts))


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for an in-memory database or another store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(uri: str, timeout_s: float = 600.0) -> Iterator[None]:
    """An exclusive ``flock`` on ``mlruns/.<db>.lock`` beside a sqlite store (``mlruns/`` is git-ignored), held
    while one process creates (and migrates) the store and its experiment: two first runs on a new ``mlflow.db``
    otherwise race in MLflow's alembic migration and in creating the experiment. Other stores: no lock."""
    db = _sqlite_file(uri)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        fcntl = None
    if db is None or fcntl is None:
        yield
        return
    import time

    lock = db.parent / "mlruns" / f".{db.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(lock, "a") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RaimError(f"MLflow store {uri}: {lock} stayed locked for {timeout_s:.0f} s (another "
                                    f"process creating the store?)") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _experiment_id(name: str, uri: str) -> str:
    """The experiment's id, created if missing. The first MLflow call opens (creates, migrates) the store: run it
    under :func:`store_lock`."""
    import mlflow

    exp = mlflow.get_experiment_by_name(name)
    if exp is None:
        try:
            return mlflow.create_experiment(name, artifact_location=artifact_root(uri, name))
        except Exception:  # another process created it meanwhile (a server store: no lock)
            exp = mlflow.get_experiment_by_name(name)
            if exp is None:
                raise
    return exp.experiment_id


_SET_UP: dict[tuple[str, str], str] = {}  # (store URI, experiment) → id, while a run set up there is active


def setup(cfg: DictConfig | None = None) -> str:
    """Point MLflow at the configured store and experiment; returns the experiment id. Safe when several
    processes start on a new sqlite store at once (:func:`store_lock`). Done once per run: while a run set up on
    the same store and experiment is active (its nested dataset runs), the id is reused without asking the
    store again."""
    import mlflow

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = tracking_uri(cfg)
    name = (OmegaConf.select(cfg, "tracking.experiment", default=None) if cfg is not None else None) or "raim"
    active = mlflow.active_run()
    if active is not None and _SET_UP.get((uri, name)) == active.info.experiment_id \
            and mlflow.get_tracking_uri() == uri:
        return active.info.experiment_id
    mlflow.set_tracking_uri(uri)
    with store_lock(uri):
        exp_id = _experiment_id(name, uri)
    mlflow.set_experiment(experiment_id=exp_id)
    _SET_UP.clear()
    _SET_UP[(uri, name)] = exp_id
    return exp_id


def base_tags(cfg: DictConfig, kind: str) -> dict[str, str]:
    tags = {"kind": kind, **choices(cfg)}
    sha, dirty = git_commit()
    if sha:
        tags.update({"git_commit": sha, "mlflow.source.git.commit": sha, "git_dirty": str(dirty).lower()})
    return tags


def _sweep_parent(cfg: DictConfig, exp_id: str) -> str | None:
    """In a Hydra multirun, the id of the sweep's parent run (created by the first job that asks)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
            return None
        hc = HydraConfig.get()
        sweep_id = str(hc.sweep.dir)
        overrides = " ".join(hc.overrides.task)
    except Exception:
        return None
    found = mlflow.search_runs([exp_id], filter_string=f"tags.sweep_dir = '{sweep_id}' and tags.kind = 'sweep'",
                               output_format="list", max_results=1)
    if found:
        return found[0].info.run_id
    client = MlflowClient()
    tags = {**base_tags(cfg, "sweep"), "sweep_dir": sweep_id, "mlflow.runName": f"sweep {Path(sweep_id).name}"}
    tags = {k: v for k, v in tags.items() if k not in ("dataset", "roster", "frame", "stacker")}
    run = client.create_run(exp_id, tags=tags)
    client.log_param(run.info.run_id, "first_job_overrides", scrub_text(overrides))
    client.set_terminated(run.info.run_id, "FINISHED")  # a container: children attach to it as they come
    return run.info.run_id


@contextlib.contextmanager
def start_run(cfg: DictConfig, kind: str, tags: dict | None = None, nested: bool = False,
              run_name: str | None = None) -> Iterator[Any]:
    """Open a tagged run with the composed config logged as params (secrets scrubbed); yields the run.

    Nested under the active run if there is one; inside a Hydra multirun with no active run, nested under the
    sweep's parent run (``$RAIM_MLFLOW_PARENT_RUN_ID`` names a parent explicitly). ``nested`` is accepted for
    symmetry with ``mlflow.start_run``: with no parent to nest under, the run is a top-level one.
    """
    import mlflow

    exp_id = setup(cfg)
    all_tags = {**base_tags(cfg, kind), **{k: str(v) for k, v in (tags or {}).items()}}
    all_tags = scrub(all_tags)  # key-aware: git_commit and *_sha256 keep their hashes
    active = mlflow.active_run()
    kwargs: dict[str, Any] = {"experiment_id": exp_id, "tags": all_tags, "run_name": run_name}
    if active is not None:
        kwargs["nested"] = True
    elif kind != "sweep":
        parent = _sweep_parent(cfg, exp_id)
        if parent:
            kwargs["parent_run_id"] = parent
            kwargs["nested"] = True
    with mlflow.start_run(**kwargs) as run:
        if active is None:  # children inherit the parent's config: log it once
            data = run_config(cfg)
            mlflow.log_params(flatten(data))
            with tempfile.TemporaryDirectory() as tmp:
                p = Path(tmp) / "config.yaml"
                p.write_text(OmegaConf.to_yaml(OmegaConf.create(data)))
                mlflow.log_artifact(str(p))
        yield run


def run_config(cfg: DictConfig) -> dict:
    """The composed config a run logs, secrets scrubbed; without the roster for a bring-your-own verdict table
    (no roster judged it)."""
    data = scrub(to_container(cfg))
    if byo_verdicts(data):
        data.pop("roster", None)
    return data


# Per dataset run: the values that tell one analysis from another (a sweep's stacker and analysis settings, the
# frame, the roster or the bring-your-own table, the subsample), so that MLflow's Compare separates the runs.
DISTINGUISHING = ("stacker", "analysis", "frame.name", "roster.name", "verdicts", "frontier", "judge.per_dataset",
                  "judge.missing")


def distinguishing_params(cfg: DictConfig) -> dict[str, str]:
    """:data:`DISTINGUISHING` as MLflow params (dotted keys, as on the parent run)."""
    data, out = run_config(cfg), {}
    for key in DISTINGUISHING:
        node = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            out.update(flatten(node, f"{key}."))
    return out


def log_figures(paths: Iterable[str | Path], artifact_path: str = "figures") -> list[str]:
    """Log figure files (PNG/PDF/SVG…) of the active run; returns the logged file names."""
    import mlflow

    logged = []
    for p in map(Path, paths):
        if p.is_file():
            mlflow.log_artifact(str(p), artifact_path=artifact_path)
            logged.append(p.name)
    return logged


def log_metrics(metrics: Mapping[str, float], series: Mapping[str, Iterable[float]] | None = None,
                model_id: str | None = None) -> None:
    """The active run's metrics in one batch (one store transaction, not one per metric): ``metrics`` at step 0,
    each of ``series`` as one value per step (e.g. β per fold, step = fold). ``model_id``: the step-0 metrics
    are also the metrics of that logged model (what MLflow's ``log_model`` does for metrics logged before it,
    at one query per metric name)."""
    import time

    import mlflow
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    rows = [Metric(k, float(v), ts, 0, model_id=model_id) for k, v in metrics.items()]
    rows += [Metric(k, float(v), ts, i, model_id=None if i else model_id)
             for k, vals in (series or {}).items() for i, v in enumerate(vals)]
    mlflow.MlflowClient().log_batch(mlflow.active_run().info.run_id, metrics=rows)


def log_json(obj: Any, name: str) -> None:
    """A JSON artifact of the active run (secrets scrubbed)."""
    import mlflow

    mlflow.log_text(to_json(scrub(obj), default=str), name)


def run_study(cfg: DictConfig, kind: str, compute, output: str | Path, figure: str | Path, draw, metrics,
              tags=None, series=None) -> tuple[dict, Path, Path]:
    """A study entry (``python -m src.<kind>``), in the order that loses nothing: both output paths checked before
    any work, then ``compute(cfg)`` → document, ``draw(doc, figure)`` → figure, the MLflow run of kind ``kind``
    (``metrics(doc)``, ``series(doc)`` per step, ``tags(doc)``, the document and the figure) when tracking is on,
    and the JSON last, so that a failed tracking leaves the previous JSON in place. Returns (doc, JSON, figure)."""
    from src import run

    for path in (output, figure):
        run.check_output(path)
    doc = compute(cfg)
    fig = draw(doc, figure)
    if cfg.tracking.enabled:
        with start_run(cfg, kind, tags=tags(doc) if tags else None):
            log_metrics(metrics(doc), series=series(doc) if series else None)
            log_json(doc, f"{kind}.json")
            log_figures([fig])
    return doc, run.write_json(doc, output), fig


# ---------------------------------------------------------------------------------------------- analysis

def summary_metrics(s: dict) -> tuple[dict[str, float], dict[str, str]]:
    """One dataset's summary → (metrics, tags): comparators with CI bounds, deltas, members, admissibility."""
    metrics: dict[str, float] = {"n": s["n"], "n_clusters": s["n_clusters"],
                                 "abstention_rate": s["abstentions"]["rate"]}
    tags: dict[str, str] = {}
    for comp, per in s["comparators"].items():
        for m, v in per.items():
            metrics[metric_name(comp, m)] = v["estimate"]
            metrics[metric_name(comp, f"{m}_lo")], metrics[metric_name(comp, f"{m}_hi")] = v["ci"]
    for comp, per in s["deltas"].items():
        for m, d in per.items():
            base = f"delta_{comp}"
            metrics[metric_name(base, m)] = d["estimate"]
            metrics[metric_name(base, f"{m}_lo")], metrics[metric_name(base, f"{m}_hi")] = d["ci"]
            metrics[metric_name(base, f"{m}_p")] = d["p_one_sided"]
            if d.get("p_holm") is not None:
                metrics[metric_name(base, f"{m}_p_holm")] = d["p_holm"]
            tags[f"call.{comp}.{m}"] = d["call"]
    for member, v in s["members"].items():
        for m in ("kappa", "bacc", "f1", "coverage"):
            metrics[metric_name("member", member, m)] = v[m]
    adm = s["admissibility"]
    metrics["adm/members_at_kappa0"] = adm["members_at_kappa0"]
    metrics["adm/share_at_kappa0"] = adm["members_at_kappa0"] / max(adm["n_members"], 1)
    metrics["adm/admissible"] = float(bool(adm["admissible"]))
    for k in ("phi_bar", "agreement_proxy"):
        if adm.get(k) is not None:
            metrics[f"adm/{k}"] = adm[k]
    tags["admissible"] = str(bool(adm["admissible"])).lower()
    tags["admissibility_reason"] = adm["reason"]
    tags["best_cv_call"] = s["deltas"]["best_cv"]["kappa"]["call"]
    tags.update(decision_tags(s.get("decision")))
    for k, v in s["stacker"]["beta_mean"].items():
        metrics[metric_name("beta", k)] = v
    for k, v in s["stacker"]["beta_full"].items():
        metrics[metric_name("beta_full", k)] = v
    if "abstention_contrast" in s:
        ac = s["abstention_contrast"]
        metrics["abstention/delta_category_minus_scalar"] = ac["delta_category_minus_scalar"]["estimate"]
    return {k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(v)}, tags


def decision_tags(d: dict | None) -> dict[str, str]:
    """The deployment decision (:mod:`src.decide`) as tags: ``decision`` (panel / single / none),
    ``decision_member`` (the single judge, or ``none``), ``decision_reason``."""
    if not d:
        return {}
    return {"decision": d["action"], "decision_member": d["member"] or "none", "decision_reason": d["reason"]}


def beta_table(s: dict):
    """β per stacker feature: fold-mean, each fold, and the refit on all items (a DataFrame)."""
    import pandas as pd

    st = s["stacker"]
    df = pd.DataFrame({"feature": list(st["beta_mean"]), "mean": list(st["beta_mean"].values())})
    for i, fold in enumerate(st["beta_folds"]):
        df[f"fold{i}"] = df["feature"].map(fold)
    df["full"] = df["feature"].map(st["beta_full"])
    return df


def stacker_example(table, result, rows: int = 5):
    """Input example of the served stacker: the first rows of the dataset's design matrix, over exactly the
    members the stacker was fitted on (``result.members``: a member that never voted on the dataset is not one)."""
    import numpy as np
    import pandas as pd

    from src.core.ladder import design_matrix

    fitted = table.subset(np.ones(len(table.gold), bool), list(result.members))
    extras = [f for f in result.feature_names if "@" in f]
    X, names = design_matrix(fitted, list(dict.fromkeys(e.split("@", 1)[1] for e in extras)))
    return pd.DataFrame(X[:rows], columns=list(fitted.members) + names)


def log_dataset(cfg: DictConfig, table, name: str, result, summary: dict | None = None) -> str:
    """The active (child) run ← one dataset's ladder and decision (``summary``: its results.json entry; default
    the ladder's summary), the params that set it apart, β table, hashes and the fitted stacker model."""
    import mlflow

    from src.mlops import serving as serve

    s = summary or result.summary
    metrics, tags = summary_metrics(s)
    mlflow.log_params(distinguishing_params(cfg))
    # the model first, then its metrics in one batch carrying its id (logged after the metrics, MLflow would
    # copy each onto the model with one history query per metric name)
    example = stacker_example(table, result)
    info = serve.log_stacker(result.stacker, list(example.columns), example)
    folds = s["stacker"]["beta_folds"]  # β per fold as a series (step = fold)
    log_metrics(metrics, {metric_name("beta_fold", k): [f[k] for f in folds] for k in (folds[0] if folds else {})},
                model_id=info.model_id)
    mlflow.set_tags({**tags, **input_hashes(cfg, table, name), "stacker_model_uri": info.model_uri})
    mlflow.log_text(beta_table(s).to_csv(index=False), "beta.csv")
    log_json(s, "summary.json")
    return info.model_uri


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """MLflow's INFO/WARNING chatter (store creation, CloudPickle advice, example validation) kept out of the
    run's output; RAIM checks the logged models itself (:func:`src.mlops.serving.log_stacker`). Errors still show."""
    import logging
    import warnings

    loggers = {name: logging.getLogger(name) for name in ("mlflow", "alembic")}
    levels = {name: lg.level for name, lg in loggers.items()}
    try:
        for lg in loggers.values():
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"mlflow(\..*)?")
            yield
    finally:
        for name, lg in loggers.items():
            lg.setLevel(levels[name])


def ui_command(cfg: DictConfig | None = None) -> str:
    """The ``mlflow ui`` command that opens this store (README: compare runs)."""
    uri = tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000 --workers 1"


def log_analysis(cfg: DictConfig, table, results: dict, doc: dict, kind: str = "stacking") -> str:
    """One run per analysis (results.json, hashes, mean κ, the verdict cache's report), one nested child per
    dataset; returns its id. A failure of the tracking store is a :class:`RaimError` naming the store."""
    from mlflow.exceptions import MlflowException

    try:
        with quiet_mlflow():
            return _log_analysis(cfg, table, results, doc, kind)
    except Exception as e:
        # MLflow's own errors and those of its sqlite store (a locked or corrupt mlflow.db, a failed migration)
        store = type(e).__module__.split(".")[0] in ("sqlalchemy", "alembic")
        if not (store or isinstance(e, (MlflowException, OSError, ImportError))):
            raise
        why = (str(e).splitlines() or [""])[0] if store else str(e)  # SQL errors go on with the statement
        raise RaimError(f"MLflow tracking at {tracking_uri(cfg)} failed ({type(e).__name__}: {why}); nothing was "
                        f"written to results (tracking.enabled=false runs without MLflow)") from e


def _log_analysis(cfg: DictConfig, table, results: dict, doc: dict, kind: str) -> str:
    import mlflow

    by = table.by_dataset()
    with start_run(cfg, kind) as run:
        decisions = {n: s["decision"]["label"] for n, s in doc["datasets"].items() if "decision" in s}
        mlflow.set_tags({**input_hashes(cfg, table), "datasets": ",".join(results),
                         "decisions": "; ".join(f"{n}: {d}" for n, d in decisions.items())})
        log_json(doc, "results.json")
        prov = table.provenance or {}
        metrics = {}
        if "cache" in prov:
            metrics["cache/bad_lines"] = prov.get("bad_cache_lines", 0)
            metrics["cache/judged_only_dropped"] = sum(d["dropped"] for d in prov.get("judged_only", {}).values())
            log_json(prov, "verdict_cache_report.json")
        kappas = [r.summary["comparators"]["stacked"]["kappa"]["estimate"] for r in results.values()]
        metrics["stacked/kappa_mean"] = np.mean(kappas)
        metrics["admissible_count"] = sum(r.summary["admissibility"]["admissible"] for r in results.values())
        log_metrics(metrics)
        for name, result in results.items():
            with start_run(cfg, kind, tags={"dataset": name}, nested=True, run_name=name):
                log_dataset(cfg, by[name], name, result, doc["datasets"].get(name))
        return run.info.run_id


# ---------------------------------------------------------------------------------------------- DVC stage files

def compact_metrics(doc: dict) -> dict:
    """Per dataset, the headline numbers of results.json (what `dvc metrics show/diff` should compare)."""
    out = {}
    for name, s in doc["datasets"].items():
        comp, delta, adm = s["comparators"], s["deltas"], s["admissibility"]
        row = {"n": s["n"],
               "stacked": {m: comp["stacked"][m]["estimate"] for m in ("kappa", "bacc", "f1")},
               "best_cv_kappa": comp["best_cv"]["kappa"]["estimate"],
               "delta_best_cv_kappa": delta["best_cv"]["kappa"]["estimate"],
               "delta_best_cv_kappa_lo": delta["best_cv"]["kappa"]["ci"][0],
               "call_best_cv": delta["best_cv"]["kappa"]["call"],
               "admissible": bool(adm["admissible"]),
               "decision": (s.get("decision") or {}).get("action"),
               "decision_member": (s.get("decision") or {}).get("member"),
               "phi_bar": adm["phi_bar"],
               "members_at_kappa0": adm["members_at_kappa0"]}
        if "frontier" in delta:
            row["delta_frontier_kappa"] = delta["frontier"]["kappa"]["estimate"]
        out[name] = row
    return out


def beta_rows(doc: dict):
    """β per dataset and stacker feature (fold mean and full refit), long format, as a DataFrame."""
    import pandas as pd

    rows = [{"dataset": name, "feature": f, "label": f"{name}: {f}", "beta": b,
             "beta_full": s["stacker"]["beta_full"][f]}
            for name, s in doc["datasets"].items() for f, b in s["stacker"]["beta_mean"].items()]
    return pd.DataFrame(rows, columns=["dataset", "feature", "label", "beta", "beta_full"])


def write_stage_files(doc: dict, metrics: str | Path | None = None, betas: str | Path | None = None) -> None:
    """The DVC `metrics` (compact JSON) and `plots` (β CSV) files of the stacking stage, each written atomically
    (a failure leaves the previous file whole)."""
    for path, text in ((metrics, lambda: to_json(compact_metrics(doc), default=str)),
                       (betas, lambda: beta_rows(doc).to_csv(index=False, float_format="%.6g"))):
        if path:
            atomic_write_text(path, text())


ENV_DEPENDENT = ("MLFLOW_TRACKING_URI", "RAIM_RAW_DIR")  # conf/ interpolations whose env values must not be baked


def write_params(path: str | Path = ROOT / "params.yaml", overrides: Iterable[str] = ()) -> Path:
    """Regenerate params.yaml from conf/ exactly as `dvc exp run` does (DVC's Hydra composition), with the
    environment variables of :data:`ENV_DEPENDENT` unset so that no machine-specific value is committed."""
    from dvc.utils.hydra import compose_and_dump

    saved = {k: os.environ.pop(k) for k in ENV_DEPENDENT if k in os.environ}
    try:
        compose_and_dump(path, str(CONF_DIR), None, "config", "", list(overrides))
    finally:
        os.environ.update(saved)
    return Path(path)


@one_line
def main(argv: list[str] | None = None) -> int:
    """``python -m src.track params [override …]``: regenerate params.yaml from conf/."""
    ap = ArgumentParser(prog="python -m src.track")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("params", help="regenerate params.yaml from conf/ (as `dvc exp run` does)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. stacker.C=0.5")
    p.add_argument("--out", default=str(ROOT / "params.yaml"))
    a = ap.parse_args(argv)
    print(f"wrote {write_params(a.out, a.overrides)}")
    return 0


__all__ = ["tracking_uri", "start_run", "log_figures", "log_analysis", "log_json", "scrub", "scrub_text",
           "input_hashes", "summary_metrics", "setup", "metric_name", "sha256_tree", "compact_metrics",
           "write_stage_files", "write_params"]


if __name__ == "__main__":
    raise SystemExit(main())
