"""A RAIM model as data: the document a RAIM model is rebuilt from, its digest, and the reader that reads nothing
else (docs/security.md).

MLflow's pyfunc format stores a Python model as a cloudpickle beside a copy of the code it needs; loading it
(``mlflow.pyfunc.load_model``) unpickles that file and may import modules the model folder ships, so a model from
someone else — a folder, a replaced run artifact, a registry entry — can run any code. Every model RAIM logs therefore
also carries its **document**, ``artifacts/raim_model.json``: the stacker's estimator, parameters and β (§2), its
input columns, the deployment decision of its run, and for a panel model its roster, frames and model config — plain
JSON. RAIM's own commands (``src.serve``, ``src.predict``, ``src.registry``) read only that document, strictly (every
key and value checked, the roster's backends against their allow-list), and rebuild the model from the installed
RAIM (:mod:`src.mlops.packaging`): nothing in the model folder is unpickled or imported; a folder without a document
is refused in one line. The pyfunc files stay for ``mlflow models serve`` users, who load a pickle.

Integrity: the document's sha256 is recorded where the model is logged (a tag of its logged model) and where it is
promoted (a tag of the registered version, :data:`DIGEST_TAG`); reading a model through either compares the two,
and a document changed since is refused. A local folder has no record to compare with: it is read as data, no more.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from src.core.aggregate import NoiseRobustStackedLogit, StackedLogit
from src.core.errors import RaimError
from src.core.injection import DEFAULT_DEFENCE, InjectionError, check_defence
from src.core.textfiles import StrictJSONError, loads_strict
from src.io.config import build, check_keys
from src.judges.config import check_roster
from src.judges.frames import check_frame

DOCUMENT = "raim_model.json"
"""The document's name: a model folder holds it at ``artifacts/raim_model.json`` (MLflow's place for a pyfunc's
artifacts)."""
DIGEST_TAG = "raim.model_sha256"
"""The tag (of a logged model, of a registered model version) that records the document's sha256."""
FORMAT = "raim-model"
MAX_BYTES = 4 << 20  # a stacker's document is a few hundred bytes; a panel's, with its frames, a few kB

ESTIMATORS: dict[str, type[StackedLogit]] = {
    "StackedLogit": StackedLogit,
    "NoiseRobustStackedLogit": NoiseRobustStackedLogit,
}
"""The fitted stackers a document may describe, by name (compared as strings; nothing is imported)."""


class ModelRefused(RaimError, ValueError):
    """A model RAIM will not read: no document, a document that does not check, or one changed since it was
    recorded. One line naming the model and what is wrong."""


@dataclass(frozen=True)
class StackerState:
    """A fitted stacker (:meth:`src.core.aggregate.StackedLogit.state`) and which estimator it is."""

    estimator: Literal["StackedLogit", "NoiseRobustStackedLogit"]
    params: dict[str, Any]
    n_features_in: int
    intercept: float
    coef: list[float]
    train_prevalence: float | None
    flip_rates: list[float] | None = None


@dataclass(frozen=True)
class PanelConfig:
    """A panel model's config (overridable at load time): the verdict cache, whether a miss is judged, the store,
    and what the panel does with an item flagged as a prompt injection (:data:`src.core.injection.DEFENCES`; a
    document written before it carried one reads as the default, ``escalate``)."""

    cache_dir: str
    compute: bool
    monitor_store: str
    injection_defence: str = DEFAULT_DEFENCE


@dataclass(frozen=True)
class ModelDocument:
    """What a RAIM model is: a stacker over member votes, or a panel (roster + frames + stacker) over items."""

    format: Literal["raim-model"]
    version: Literal[1]
    kind: Literal["stacker", "panel"]
    columns: list[str]
    stacker: StackerState
    decision: dict[str, str | None] | None
    roster: dict[str, Any] | None = None
    frames: dict[str, dict[str, Any]] | None = None
    default_frame: str | None = None
    config: PanelConfig | None = None


def stacker_state(stacker: StackedLogit) -> StackerState:
    """The document's part for a fitted stacker."""
    name = type(stacker).__name__
    if ESTIMATORS.get(name) is not type(stacker):
        raise ModelRefused(f"a {name} cannot be stored as a RAIM model (stackers: {', '.join(ESTIMATORS)})")
    return StackerState(estimator=name, **stacker.state())  # type: ignore[arg-type]


def dumps(doc: ModelDocument) -> bytes:
    """The document's bytes: JSON with sorted keys (Python's float repr: β round-trips exactly)."""
    return (json.dumps(asdict(doc), sort_keys=True, indent=1, allow_nan=False) + "\n").encode("utf-8")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(doc: ModelDocument, folder: str | Path) -> Path:
    """The document as ``<folder>/raim_model.json`` (what a model logs as its artifact)."""
    path = Path(folder) / DOCUMENT
    path.write_bytes(dumps(doc))
    return path


def _finite(values: list[float], where: str) -> None:
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ModelRefused(f"{where}: {bad[0]!r} is not a finite number")


def check_stacker(state: StackerState, columns: list[str], where: str) -> StackedLogit:
    """The fitted stacker a document describes, rebuilt from its numbers after checking them: its parameters
    against the estimator's signature, β's length against the columns and the abstention coding, every number
    finite, the flip rates present exactly for the noise-robust stacker."""
    cls = ESTIMATORS[state.estimator]
    params = check_keys(cls, state.params, f"{where}: stacker.params")
    if params.get("flip_rates") is not None:
        params["flip_rates"] = tuple(params["flip_rates"])
    if state.n_features_in != len(columns):
        raise ModelRefused(f"{where}: stacker.n_features_in={state.n_features_in}, but it has {len(columns)} columns")
    k = params.get("n_votes") or state.n_features_in
    width = (2 * k if params.get("abstention") == "category" else k) + state.n_features_in - k
    if len(state.coef) != width:
        raise ModelRefused(f"{where}: stacker.coef holds {len(state.coef)} coefficients where its columns need {width}")
    _finite([state.intercept, *state.coef], f"{where}: stacker")
    if (state.flip_rates is None) != (cls is not NoiseRobustStackedLogit):
        raise ModelRefused(f"{where}: stacker.flip_rates is {'missing' if state.flip_rates is None else 'unexpected'}")
    fields = {k: v for k, v in asdict(state).items() if k != "estimator"}
    if fields["flip_rates"] is None:
        del fields["flip_rates"]
    return cls.from_state({**fields, "params": params})


def check_panel(doc: ModelDocument, where: str) -> None:
    """A panel document's roster (its backends against their allow-list, before anything is resolved or built),
    frames (every key of each) and default frame; its voting members are the stacker's columns, in order."""
    if doc.roster is None or doc.frames is None or doc.default_frame is None or doc.config is None:
        raise ModelRefused(f"{where}: a panel model needs its roster, frames, default_frame and config")
    roster = check_roster(doc.roster, f"{where}: roster")
    k = doc.stacker.params.get("n_votes") or len(doc.columns)
    if [m["name"] for m in roster["members"]] != list(doc.columns[:k]):
        raise ModelRefused(f"{where}: the roster's members are not the stacker's vote columns {doc.columns[:k]}")
    for name, frame in doc.frames.items():
        check_frame(frame, f"{where}: frames.{name}")
    if doc.default_frame not in doc.frames:
        raise ModelRefused(f"{where}: default_frame {doc.default_frame!r} is not one of its frames")
    try:
        check_defence(doc.config.injection_defence, f"{where}: config.injection_defence")
    except InjectionError as e:
        raise ModelRefused(str(e)) from None


def parse(data: bytes, where: str) -> tuple[ModelDocument, StackedLogit]:
    """The document checked whole — strict JSON (no key twice, no NaN), every key known and typed — and its
    stacker rebuilt; anything else is a :class:`ModelRefused` naming ``where``."""
    if len(data) > MAX_BYTES:
        raise ModelRefused(f"{where}: {len(data):,} bytes, over the {MAX_BYTES:,} a RAIM model document may hold")
    try:
        raw = loads_strict(data.decode("utf-8"))  # the one strict JSON reader: no key twice, no NaN, bounded depth
    except (UnicodeDecodeError, StrictJSONError, json.JSONDecodeError) as e:
        raise ModelRefused(f"{where}: not a RAIM model document ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ModelRefused(f'{where}: not a RAIM model document (no "format": "{FORMAT}")')
    try:
        doc = build(ModelDocument, raw, where)
        if doc.decision is not None:
            check_keys(_Decision, doc.decision, f"{where}: decision")
        stacker = check_stacker(doc.stacker, doc.columns, where)
        if doc.kind == "panel":
            check_panel(doc, where)
    except ModelRefused:
        raise
    except RaimError as e:  # a key or a value the document's checks refuse (a ConfigError)
        raise ModelRefused(str(e)) from None
    return doc, stacker


@dataclass(frozen=True)
class _Decision:
    action: str | None
    label: str | None
    reason: str | None


def _registry_version(uri: str) -> tuple[str, str, str] | None:
    """(name, version or alias, which) of a registry URI ``models:/<name>/<version>`` or ``models:/<name>@<alias>``;
    None for any other URI (a logged model ``models:/m-…``, ``runs:/``, a path)."""
    if not uri.startswith("models:/"):
        return None
    rest = uri[len("models:/") :]
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, alias, "alias"
    name, _, version = rest.rpartition("/")
    return (name, version, "version") if name and version.isdigit() else None


def recorded_digest(uri: str) -> tuple[str | None, str]:
    """The document sha256 recorded for ``uri`` and where: a registered version's tag (set when RAIM promoted it),
    else that of the logged model it was registered from (set when RAIM logged it); a logged model's tag; (None,
    what it is) when nothing records one."""
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    client = MlflowClient()
    version = _registry_version(uri)
    logged = None
    if version is not None:
        name, ref, which = version
        mv = client.get_model_version_by_alias(name, ref) if which == "alias" else client.get_model_version(name, ref)
        where = f"registered model {name} version {mv.version}"
        source = mv.model_id or (mv.source[len("models:/") :] if (mv.source or "").startswith("models:/m-") else None)
        if mv.tags.get(DIGEST_TAG) or not source:
            return mv.tags.get(DIGEST_TAG), where
        logged = source
    elif uri.startswith("models:/m-"):
        logged = uri[len("models:/") :]
    if logged is None and uri.startswith("runs:/"):
        run_id, _, path = uri[len("runs:/") :].partition("/")
        found = client.search_logged_models(filter_string=f"source_run_id = '{run_id}' AND name = '{path}'")
        logged = found[0].model_id if len(found) == 1 else None
    if logged is None:
        return None, "a model folder"
    return client.get_logged_model(logged).tags.get(DIGEST_TAG), f"logged model {logged}"


def fetch(uri: str) -> bytes:
    """The document's bytes of the model at ``uri``: a local model folder, or any MLflow model URI (downloaded into
    a temporary folder: downloading reads files, it runs none)."""
    local = Path(uri)
    if local.is_dir():
        return _document_in(local, uri)
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    with tempfile.TemporaryDirectory(prefix="raim-model-") as tmp:
        return _document_in(Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp)), uri)


def _document_in(folder: Path, uri: str) -> bytes:
    path = folder / "artifacts" / DOCUMENT
    if not path.is_file():
        raise ModelRefused(
            f"{uri}: no artifacts/{DOCUMENT}: not a model RAIM logged as data (a model logged before RAIM stored "
            "models as data: log it again; any other pyfunc model: `mlflow models serve`, which unpickles it)"
        )
    return path.read_bytes()


def read(uri: str) -> tuple[ModelDocument, StackedLogit, str]:
    """The checked document of the model at ``uri``, its rebuilt stacker, and its sha256, compared first with the
    digest recorded for the URI where one is (:func:`recorded_digest`)."""
    data = fetch(uri)
    digest = sha256(data)
    if not Path(uri).is_dir():
        expected, source = recorded_digest(uri)
        if expected is None and _registry_version(uri) is not None:
            raise ModelRefused(
                f"{uri}: {source} records no {DIGEST_TAG}, nor does the model it was registered from: nothing "
                "tells whether its document changed since (promote a run's stacker with `python -m src.registry "
                "promote`)"
            )
        if expected is not None and expected != digest:
            raise ModelRefused(
                f"{uri}: its {DOCUMENT} changed since it was recorded ({source}: sha256 {expected[:12]}…, now "
                f"{digest[:12]}…): refused"
            )
    doc, stacker = parse(data, uri)
    return doc, stacker, digest
