"""Secrets kept out of everything RAIM writes or logs.

Secrets (:func:`scrub`, :func:`scrub_text`): applied to the composed config (params and ``config.yaml``), to the
tags of :func:`start_run` (user tags; RAIM's own ``git_commit`` sits under a hash key) and to JSON artifacts.
The hashes RAIM sets itself on dataset runs (``*_sha256``, ``stacker_model_uri``) are not scrubbed. Hydra's
own copies of the config are scrubbed too: conf/config.yaml turns Hydra's ``.hydra/`` off
(``hydra.output_subdir: null``) and :class:`ScrubHydraOutputs` writes it scrubbed instead; a sweep's
``multirun.yaml`` sits in a private (0700) folder and is rewritten scrubbed as each job starts.

Two rules keep a secret from ever being resolved into what is written, so that scrubbing is the second line:

* Persisted configs keep references: :func:`persistable` (a panel model's pickled roster) resolves every value
  but one that resolves to a secret, which stays ``${oc.env:…}``, read again where the copy is used
  (:func:`resolved`); a secret given as a value there is refused. params.yaml: :func:`src.io.config.write_params`, its
  secret-named literal values redacted (:func:`without_literal_secrets`).
* What a RAIM Hydra app prints or logs is scrubbed (:func:`scrub_message`): Hydra's own reports (composition
  errors, a failed job's override list and exception, ``--cfg``/``--info``, ``HYDRA_FULL_ERROR`` tracebacks,
  argument errors: :func:`scrub_hydra_reports`), every log record (:func:`scrub_log_records`), RAIM's one-line
  errors (:func:`src.core.errors.one_line`); the values of secret-named overrides are known secrets for the rest
  of the process (:func:`override_secrets`, :func:`add_secrets`).

* By key: the value under a secret-looking key is redacted whole (whatever its type). Key names are split
  into words (snake, kebab, dotted, camelCase): a word containing password/passwd/passphrase/secret/apikey/
  credential/privatekey, a word ending in ``token`` (``HF_TOKEN``, ``accessToken``; not ``max_tokens``, not
  ``tokenizer``), the words auth/authorization/bearer/cookie/pwd, or the pairs ``api key`` / ``private key`` /
  ``access key``; but not a key whose last word names where a secret lives rather than the secret
  (``SSH_AUTH_SOCK``, ``token_file``, ``password_path``, ``auth_type`` …).
* By value, everywhere (config values, nested lists, free text, URLs, tags): the values of secret-named
  environment variables and the known secrets above; URL passwords (``https://***@host``); ``name=value`` and
  ``Name: value`` pairs with a secret name (``+judge.api_key=…``, ``?access_token=…``, ``Authorization: …``),
  whose value may be an auth scheme and its credential (``Authorization=Bearer <token>``: both go, however
  short the token), and a whole override's value runs to its end (``+db.password=two words``, ``…=[a,b]``);
  pairs inside another pair's value (a URL's query) too; ``Bearer``/``Basic`` credentials (the scheme word is kept);
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
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hydra._internal import utils as hydra_utils
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from src.core.errors import RaimError, add_redactor, redact_exception
from src.io.config import both_forms, load_plain, plain, resolve_references, to_yaml
from src.io.files import atomic_write_text

REDACTED = "***"


_KEY_WORD = re.compile(r"(?:[A-Z]+(?![a-z])|[A-Z]?[a-z]+)[0-9]*|[0-9]+")  # sha256, md5: one word


_SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "apikey", "credential", "privatekey")


_SECRET_WORDS = frozenset({"auth", "authorization", "bearer", "cookie", "pwd"})


_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})


_WHERE_WORDS = frozenset({"sock", "socket", "file", "path", "dir", "type", "method", "mode", "url", "uri", "host"})


_HASH_WORDS = frozenset(
    {"revision", "rev", "sha", "sha1", "sha256", "sha512", "commit", "hash", "digest", "md5", "checksum", "etag"}
)


_ID_PAIRS = frozenset(
    {("run", "id"), ("model", "id"), ("experiment", "id"), ("model", "uri"), ("stacker", "uri"), ("artifact", "uri")}
)


def _key_words(name: str) -> list[str]:
    return [w.lower() for w in _KEY_WORD.findall(str(name))]


def _pairs(words: list[str]) -> set[tuple[str, str]]:
    return set(zip(words, words[1:]))


def secret_key(name: str) -> bool:
    """Whether a config key or environment variable name looks like it holds a secret (the rule above)."""
    words = _key_words(name)
    if not words or words[-1] in _WHERE_WORDS:
        return False
    return (
        any(p in w for w in words for p in _SECRET_PARTS)
        or any(w.endswith("token") for w in words)
        or bool(_SECRET_WORDS.intersection(words))
        or bool(_SECRET_PAIRS & _pairs(words))
    )


def hash_key(name: str) -> bool:
    """Whether a key declares a hash or an id (``git_commit``, ``*_sha256``, ``revision``, ``run_id``)."""
    words = _key_words(name)
    return bool(_HASH_WORDS.intersection(words)) or bool(_ID_PAIRS & _pairs(words))


_B = r"(?<![A-Za-z0-9])"  # a token starts at a word boundary (``task-…`` holds no ``sk-`` key)


_PROVIDER = re.compile(
    _B + r"(?:sk-ant-[A-Za-z0-9_-]{8,}|gsk_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_-]{35}"
    r"|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}"
    r"|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"
    r"|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}|xai-[A-Za-z0-9]{40,}|r8_[A-Za-z0-9]{30,}"
    r"|eyJ[\w-]{10,}\.[\w-]{10,}\.[\w-]{10,})"
)


_SK = re.compile(_B + r"sk-(?:proj-|svcacct-|admin-)?(?P<body>[A-Za-z0-9_-]{20,})")


_SCHEME = re.compile(r"(?i)\b(?P<scheme>bearer|basic)(?P<sp>\s+)(?P<tok>[A-Za-z0-9._~+/=-]{8,})")


_AUTH_SCHEMES = r"bearer|basic|digest|negotiate|ntlm|token|apikey"  # an HTTP credential: scheme word + credential


_NAMED = re.compile(
    r"(?P<key>[A-Za-z_][\w.-]*)(?P<eq>\s*[=:]\s*)(?P<val>'[^']*'|\"[^\"]*\""
    r"|(?:(?i:" + _AUTH_SCHEMES + r")\s+)?[^\s&,;'\"]+)"
)


_OVERRIDE = re.compile(r"\s*(?P<key>[~+]{0,2}[A-Za-z_][\w.\-/@]*)=(?P<val>[^\n]*)")  # one whole Hydra override


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
    keyish = (
        re.search("[0-9]", body) and re.search("[A-Za-z]", body) and max(map(len, re.split(r"[_-]", body))) >= 16
    )  # not ``sk-learn-model-version-1``
    return REDACTED if keyish else m[0]


def _scheme_credential(m: re.Match) -> str:
    tok = m["tok"]
    credential = re.search("[0-9]", tok) or (len(tok) >= 16 and re.search("[A-Z]", tok) and re.search("[a-z]", tok))
    return f"{m['scheme']}{m['sp']}{REDACTED}" if credential else m[0]


def _named(text: str) -> str:
    """Secret-named pairs' values redacted; the value of any other pair is read on for pairs inside it (a URL's
    query, ``unrecognized arguments: +judge.api_key=…``)."""
    out, pos = [], 0
    while (m := _NAMED.search(text, pos)) is not None:
        if secret_key(m["key"]):
            out.append(text[pos : m.start("val")] + REDACTED)
            pos = m.end()
        else:
            out.append(text[pos : m.start("val")])
            pos = m.start("val")
    return "".join(out) + text[pos:]


_KNOWN: set[str] = set()  # values given under a secret name in this process (:func:`add_secrets`)


def add_secrets(values: Iterable[str]) -> None:
    """Values this process now knows to be secrets (those of 6 characters or more): redacted wherever they
    appear from now on, like the values of secret-named environment variables."""
    _KNOWN.update(v for v in map(str, values) if len(v) >= 6)


def override_secrets(overrides: Iterable[str]) -> list[str]:
    """The values that Hydra overrides give under a secret name (``+judge.api_key=…``, each value of a sweep
    ``…api_key=a,b``, and the credential of ``Authorization=Bearer …``)."""
    parser, out = OverridesParser.create(), []
    for o in overrides:
        m = _OVERRIDE.fullmatch(str(o))
        if not m or not secret_key(m["key"].lstrip("~+")):
            continue
        try:
            (ov,) = parser.parse_overrides([str(o)])
            vals = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        except Exception:  # noqa: BLE001 - an override Hydra itself rejects: its raw text is the value
            vals = [m["val"]]
        vals += [m["val"], *(v.split()[-1] for v in vals if v.split())]
        out += [v.strip("'\"") for v in vals]
    return out


_SHELL_VARS = frozenset({"PWD", "OLDPWD"})  # the shell's working directories: "pwd" here is no password


def _secret_env_values() -> list[str]:
    """Values of environment variables whose names look secret (ANTHROPIC_API_KEY, HF_TOKEN, …), and the
    secrets this process was told of (:func:`add_secrets`)."""
    vals = {v for k, v in os.environ.items() if k not in _SHELL_VARS and secret_key(k) and v and len(v) >= 6} | _KNOWN
    return sorted(vals, key=len, reverse=True)


def scrub_text(text: str, secrets: Iterable[str] | None = None, by_shape: bool = True) -> str:
    """Redact secrets in free text: known env secrets, URL passwords, secret-named ``name=value`` pairs,
    ``Bearer``/``Basic`` credentials, provider key shapes and (``by_shape``) long hex / base64-like tokens."""
    secrets = _secret_env_values() if secrets is None else secrets
    for s in secrets:
        text = text.replace(s, REDACTED)
    whole = _OVERRIDE.fullmatch(text)
    if whole and secret_key(whole["key"].lstrip("~+")) and whole["val"].strip():
        return f"{text[: whole.start('val')]}{REDACTED}"  # a whole override: its value runs to the end
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _named(text)
    text = _SCHEME.sub(_scheme_credential, text)
    text = _SK.sub(_sk_key, _PROVIDER.sub(REDACTED, text))
    if by_shape:
        text = _LONG_HEX.sub(
            lambda m: REDACTED if re.search("[0-9]", m[0]) and re.search("[A-Fa-f]", m[0]) else m[0], text
        )
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


class SecretInConfig(RaimError, ValueError):
    """A config to persist holds a secret as a value, not as a reference to where it lives."""


def _reference(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _keep_references(raw: Any, resolved: Any, key: str) -> Any:
    if _reference(raw) and raw != resolved:  # an interpolation
        if _reference(resolved):  # an escaped one (\${oc.env:…}): the reference, as text
            return resolved
        return raw if scrub(resolved, key=key) != resolved else resolved
    if isinstance(raw, Mapping) and isinstance(resolved, Mapping):
        return {k: _keep_references(raw.get(k), v, str(k)) for k, v in resolved.items()}
    if isinstance(raw, list) and isinstance(resolved, list) and len(raw) == len(resolved):
        return [_keep_references(r, v, key) for r, v in zip(raw, resolved)]
    return resolved


def _literal_secrets(data: Any, path: str = "") -> list[str]:
    """The dotted keys under which ``data`` holds a secret :func:`scrub` would redact that is not a reference."""
    if isinstance(data, Mapping):
        return [p for k, v in data.items() for p in _literal_secrets(v, f"{path}{k}.")]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _literal_secrets(v, f"{path}{i}.")]
    key = path[:-1].rsplit(".", 1)[-1]
    if _reference(data) and scrub_text(data, by_shape=False) == data:
        return []
    return [path[:-1]] if scrub(data, key=key) != data else []


def without_literal_secrets(data: Any, key: str = "") -> Any:
    """A copy of persisted plain data (params.yaml) with each secret given as a value redacted: a secret-named
    key's literal value and every known secret inside a string (not the generic shape rules: params.yaml holds
    hashes). References to the environment (``${oc.env:…}``) are kept: they hold no secret."""
    if isinstance(data, Mapping):
        return {k: without_literal_secrets(v, str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [without_literal_secrets(v, key) for v in data]
    if _reference(data) and scrub_text(data, by_shape=False) == data:
        return data
    if key and secret_key(key) and data not in (None, "", False, [], {}):
        return REDACTED
    return scrub_text(data, by_shape=False) if isinstance(data, str) else data


def persistable(cfg: Mapping, what: str = "config", raw: Mapping | None = None) -> Any:
    """A config as plain data to persist (pickled in a model, written to a file): every value resolved except
    one that resolves to a secret, which stays the interpolation it is (``${oc.env:RAIM_OPENAI_API_KEY,null}``),
    to be resolved again where the copy is used; an escaped ``\\${…}`` stays a reference as well. A secret that is
    a value in the config (``api_key=sk-…`` as an override: no reference to keep) is refused
    (:class:`SecretInConfig`, naming its key), as a persisted copy would hold it. ``cfg``: the resolved config
    (a node of :class:`src.io.settings.Settings`), ``raw``: the same before resolution, when known."""
    if raw is not None:
        data = _keep_references(plain(raw, False), plain(cfg, False), "")
    else:
        unresolved, data = both_forms(cfg)
        if unresolved is not data:
            data = _keep_references(unresolved, data, "")
    bad = _literal_secrets(data)
    if bad:
        raise SecretInConfig(
            f"{what}: {', '.join(bad)} holds a secret as a value; a persisted copy stores none: "
            f"give it as a reference to the environment, ${{oc.env:NAME}}, read where it is used"
        )
    return data


def resolved(data: Any, what: str = "config") -> Any:
    """A :func:`persistable` copy with its references resolved from this process's environment (one line naming
    the variable when one without a default is unset)."""
    return resolve_references(data, what)


def scrub_message(text: str) -> str:
    """What RAIM prints or logs, scrubbed (:func:`scrub_text` without the generic shape rules: a printed line
    names run ids and hashes, which those would take for tokens)."""
    return scrub_text(text, by_shape=False)


add_redactor(scrub_message)  # RAIM's one-line errors (src.core.errors.one_line) print no secret


def _scrubbing_record_factory(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: logging reports it itself
            return record
        clean = scrub_message(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return record

    factory.scrubs = True  # type: ignore[attr-defined]
    return factory


def scrub_log_records() -> None:
    """From now on every log record of this process is scrubbed as it is made (:func:`scrub_message`), on
    every handler: the console, a Hydra job's ``.log`` file, a launcher's list of each job's overrides."""
    make = logging.getLogRecordFactory()
    if not getattr(make, "scrubs", False):
        logging.setLogRecordFactory(_scrubbing_record_factory(make))


class ScrubbingStream:
    """A text stream that scrubs (:func:`scrub_message`) each piece of text written to it before passing it on;
    every other attribute is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(scrub_message(text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def scrubbed_output() -> Iterator[None]:
    """stdout and stderr scrubbed while inside; an exception leaving it has its message redacted
    (:func:`src.core.errors.redact_exception`), so the traceback Python then prints shows no secret either."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ScrubbingStream(sys.stdout), ScrubbingStream(sys.stderr)
    try:
        yield
    except BaseException as e:
        redact_exception(e)
        raise
    finally:
        sys.stdout, sys.stderr = saved


def scrub_hydra_reports() -> None:
    """Hydra's ``@hydra.main`` runs every step of an app (composing the config, ``--cfg``/``--info``, the job)
    through ``hydra._internal.utils.run_and_report``, which prints what goes wrong on stderr: a composition error
    quotes the override (``To append to your config use +judge.api_key=…``), a failed job's exception follows
    ``Error executing job with overrides: [...]``, ``HYDRA_FULL_ERROR=1`` re-raises it to Python; a command line
    its argument parser rejects is printed back (``unrecognized arguments: …``). Wrapped here
    (once, when this module is imported, before any RAIM app starts), each step runs under
    :func:`scrubbed_output` with log records scrubbed (:func:`scrub_log_records`) and the command line's
    secret-named overrides known as secrets (:func:`override_secrets`): whatever a RAIM Hydra app prints or logs,
    and the traceback it ends with, is scrubbed."""
    hydra_main = importlib.import_module("hydra.main")  # the module (``hydra.main`` is also the decorator)
    run, parser = hydra_utils.run_and_report, hydra_main.get_args_parser
    if getattr(run, "scrubs", False):
        return

    @functools.wraps(run)
    def run_and_report(func: Any) -> Any:
        add_secrets(override_secrets(sys.argv[1:]))
        scrub_log_records()
        with scrubbed_output():
            return run(func)

    @functools.wraps(parser)
    def get_args_parser() -> Any:
        p = parser()
        error = p.error

        def scrubbed_error(message: str) -> Any:
            add_secrets(override_secrets(sys.argv[1:]))
            return error(scrub_message(message))

        p.error = scrubbed_error  # type: ignore[method-assign]
        return p

    run_and_report.scrubs = True  # type: ignore[attr-defined]
    hydra_utils.run_and_report, hydra_main.get_args_parser = run_and_report, get_args_parser


scrub_hydra_reports()


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

    @staticmethod
    def guard(config: Any) -> None:
        """The overrides' secret values become known secrets (:func:`add_secrets`) and log records are scrubbed
        (:func:`scrub_log_records`)."""
        add_secrets(override_secrets(plain(config, False).get("hydra", {}).get("overrides", {}).get("task") or []))
        scrub_log_records()

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        self.guard(config)

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True, mode=0o700)
        self.guard(config)

    def on_job_end(self, config: Any, job_return: JobReturn, **kwargs: Any) -> None:
        """A failed job: Hydra then prints ``Error executing job with overrides: [...]`` and the exception on
        stderr; both are scrubbed first."""
        if job_return.status == JobStatus.FAILED:
            job_return.overrides = scrub(list(job_return.overrides or []))
            redact_exception(job_return._return_value)

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        self.guard(config)

        def save(data: Any, path: Path) -> None:
            atomic_write_text(path, to_yaml(scrub(data)))

        data = plain(config, False)
        hydra_node = data.pop("hydra")
        if self.subdir:
            out = Path(str(config.hydra.runtime.output_dir)) / self.subdir
            save(data, out / "config.yaml")
            save({"hydra": hydra_node}, out / "hydra.yaml")
            save(hydra_node["overrides"]["task"], out / "overrides.yaml")
        sweep = Path(str(config.hydra.sweep.dir)) / "multirun.yaml"
        if config.hydra.mode == RunMode.MULTIRUN and sweep.is_file():
            save(load_plain(sweep), sweep)
