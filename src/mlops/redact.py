"""Secrets kept out of everything RAIM writes or logs.

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

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from src.io.files import atomic_write_text

REDACTED = "***"


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
