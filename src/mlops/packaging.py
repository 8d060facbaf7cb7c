"""The pyfunc models (:mod:`src.mlops.serving`) as MLflow logs, saves and loads them: their signatures, the code
they ship (:func:`code_tree`), RAIM's pinned requirements, and their document (:mod:`src.mlops.artifact`,
:func:`document_of`): RAIM's own commands rebuild a model from that JSON alone (:func:`load_model`), never from the
pickle MLflow keeps for ``mlflow models serve``; :func:`self_check`: whether a logged stacker can serve.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

from src.core.injection import DEFAULT_DEFENCE, check_defence
from src.core.verdicts import ABSTAIN
from src.io.modules import closure
from src.io.paths import PACKAGE_DIR
from src.mlops import artifact
from src.mlops.redact import persistable
from src.mlops.serving import (
    PANEL_OPTIONAL,
    SCORED_CACHE,
    PanelModel,
    StackerModel,
    frame_configs,
    panel_roster,
    run_decision,
)


def panel_signature(columns: list[str], n_votes: int):
    from mlflow.models import ModelSignature  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.types import ColSpec, Schema  # imported here, not at start-up: mlflow ~1.8 s

    inputs = Schema([ColSpec("string", "candidate")] + [ColSpec("string", c, required=False) for c in PANEL_OPTIONAL])
    outputs = Schema(
        [ColSpec("string", "item_id")]
        + [ColSpec("long" if j < n_votes else "double", c, required=False) for j, c in enumerate(columns)]
        + list(stacker_signature(columns, n_votes).outputs.inputs)
        + [ColSpec("string", "uncached")]
        + [ColSpec("boolean", "injection_flag"), ColSpec("string", "injection_reasons")]
        + [ColSpec("string", "injection_action")]
    )
    return ModelSignature(inputs=inputs, outputs=outputs, params=inference_params())


def log_panel(
    roster: dict,
    stacker,
    columns: list[str],
    default_frame: str = "claim",
    cache_dir: str | Path | None = None,
    compute: bool = True,
    name: str = "panel",
    decision: Mapping[str, Any] | None = None,
    injection_defence: str = DEFAULT_DEFENCE,
    raw_roster: Mapping[str, Any] | None = None,
):
    """Log a :class:`PanelModel` (roster + frames + fitted stacker) in the active run; returns ``ModelInfo``.
    ``injection_defence``: what it does with an item flagged as a prompt injection (:data:`src.core.injection.
    DEFENCES`; its model config, which the scoring requests cannot change).
    The roster is logged unresolved where it holds a secret (:func:`src.mlops.redact.persistable`); one that
    holds a secret as a value is refused (:class:`src.mlops.redact.SecretInConfig`); ``raw_roster``: the roster
    before its interpolations were resolved (:attr:`src.io.settings.Settings.unresolved`), when known."""

    roster = persistable(roster, f"roster {roster.get('name')!r}", raw_roster)  # the pickled model holds no secret
    roster = panel_roster(roster, columns, stacker.n_votes)
    members = [m["name"] for m in roster["members"]]
    frames = frame_configs()
    if default_frame not in frames:
        raise ValueError(f"default frame {default_frame!r} not among {sorted(frames)}")
    example = pd.DataFrame(
        {
            "question": [""],
            "evidence": ["Paris is the capital of France."],
            "candidate": ["The capital of France is Paris."],
        }
    )
    config = {
        "cache_dir": str(Path(cache_dir or SCORED_CACHE).resolve()),
        "compute": bool(compute),
        "monitor_store": "",  # "": $RAIM_MONITOR_STORE
        "injection_defence": check_defence(injection_defence, "injection_defence"),
    }
    model = PanelModel(roster, frames, default_frame, stacker, columns, decision)
    model.config = dict(config)  # its document (document_of) records the config it is logged with
    return _log_pyfunc(
        name,
        model,
        panel_signature(list(columns), stacker.n_votes or len(columns)),
        example,
        model_config=config,
        metadata={
            "roster": roster.get("name"),
            "members": members,
            "default_frame": default_frame,
            **_decision_metadata(decision),
        },
    )


def _decision_metadata(decision: Mapping[str, Any] | None) -> dict:
    d = run_decision(decision)
    return {"run_decision": d["label"], "run_decision_action": d["action"]} if d else {}


@contextlib.contextmanager
def _pins_from_this_environment() -> Iterator[None]:
    """MLflow checks a model's pinned requirements against the environment when it saves the model and again when
    it loads it back to validate the input example, rebuilding a map of every installed package to do it (~1.5 s
    of a ``src.run`` that logs four stackers). RAIM's pins are read from this interpreter
    (:func:`pip_requirements`), so while RAIM logs its own models that check cannot find a mismatch and is skipped
    (tests/test_track.py checks the pins against the installed distributions). Loading a model anywhere else
    still runs it."""
    import mlflow.pyfunc  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.utils import environment  # imported here, not at start-up: mlflow ~1.8 s

    modules = [m for m in (environment, mlflow.pyfunc) if hasattr(m, "warn_dependency_requirement_mismatches")]
    checks = [m.warn_dependency_requirement_mismatches for m in modules]
    try:
        for m in modules:
            m.warn_dependency_requirement_mismatches = lambda requirements: None
        yield
    finally:
        for m, check in zip(modules, checks):
            m.warn_dependency_requirement_mismatches = check


@contextlib.contextmanager
def code_tree(modules: Iterable[str] | None) -> Iterator[str]:
    """A folder shaped like this package holding the source files ``modules`` need (:func:`src.io.modules.closure`:
    their import closure), linked where the file system allows, else copied, for a model's ``code_paths``;
    ``None``: the whole package."""
    if modules is None:
        yield str(PACKAGE_DIR)
        return
    with tempfile.TemporaryDirectory(prefix="raim-code-") as tmp:
        for path in closure(modules):
            dest = Path(tmp) / path.relative_to(PACKAGE_DIR.parent)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)
        yield str(Path(tmp) / PACKAGE_DIR.name)


def _log_pyfunc(name: str, model, signature, example: pd.DataFrame, code: Iterable[str] | None = None, **kwargs):
    """``pyfunc.log_model`` with RAIM's pins, and the model's document (:mod:`src.mlops.artifact`: what RAIM's own
    commands read, never the pickle) as its artifact ``raim_model.json``, its sha256 a tag of the logged model.
    Pickled objects refer to ``src.*``, so for ``mlflow models serve`` the model ships the package's code: the
    modules ``code`` needs (:func:`code_tree`), or the whole package (``None``: the panel, whose judges read the
    package's files)."""
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    with _pins_from_this_environment(), code_tree(code) as code_path, tempfile.TemporaryDirectory() as tmp:
        doc = artifact.write(document_of(model), tmp)
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=model,
            code_paths=[code_path],
            artifacts={"raim_model": str(doc)},
            signature=signature,
            input_example=example,
            pip_requirements=pip_requirements(),
            **kwargs,
        )
        MlflowClient().set_logged_model_tags(info.model_id, {artifact.DIGEST_TAG: artifact.sha256(doc.read_bytes())})
    return info


def document_of(model: StackerModel | PanelModel) -> artifact.ModelDocument:
    """A RAIM model's document (:mod:`src.mlops.artifact`): what :func:`model_from` rebuilds it from."""
    common = {
        "format": artifact.FORMAT,
        "version": 1,
        "columns": list(model.columns),
        "stacker": artifact.stacker_state(model.stacker),
        "decision": getattr(model, "decision", None),
    }
    if isinstance(model, StackerModel):
        return artifact.ModelDocument(kind="stacker", **common)
    config = artifact.PanelConfig(
        cache_dir=str(model.config.get("cache_dir", SCORED_CACHE)),
        compute=bool(model.config.get("compute", True)),
        monitor_store=str(model.config.get("monitor_store") or ""),
        injection_defence=str(model.config.get("injection_defence", DEFAULT_DEFENCE)),
    )
    return artifact.ModelDocument(
        kind="panel",
        roster=model.roster,
        frames=model.frames,
        default_frame=model.default_frame,
        config=config,
        **common,
    )


def model_from(doc: artifact.ModelDocument, stacker) -> StackerModel | PanelModel:
    """The model a checked document describes, built from the installed RAIM (:func:`src.mlops.artifact.parse`)."""
    if doc.kind == "stacker":
        return StackerModel(stacker, doc.columns, doc.decision)
    model = PanelModel(doc.roster, doc.frames, doc.default_frame, stacker, doc.columns, doc.decision)
    model.config = dataclasses.asdict(doc.config)
    return model


def load_model(uri: str) -> StackerModel | PanelModel:
    """A RAIM model from its document alone (:func:`src.mlops.artifact.read`: checked, and compared with the digest
    recorded for ``uri``): nothing in the model folder is unpickled or imported."""
    doc, stacker, _ = artifact.read(uri)
    return model_from(doc, stacker)


def pyfunc_model(inner: StackerModel | PanelModel):
    """MLflow's ``PyFuncModel`` around a model RAIM rebuilt (what MLflow's scoring server serves), with the signature
    RAIM derives from the document, not the one the folder's MLmodel file states."""
    from mlflow.models import Model  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.pyfunc.model import (  # imported here, not at start-up: mlflow ~1.8 s
        PythonModelContext,
        _PythonModelPyfuncWrapper,
    )

    signature = model_signature(inner)
    context = PythonModelContext(artifacts={}, model_config=getattr(inner, "config", {}))
    if isinstance(inner, PanelModel):
        inner.load_context(context)
    meta = Model(signature=signature)
    return mlflow.pyfunc.PyFuncModel(meta, _PythonModelPyfuncWrapper(inner, context, signature))


def model_signature(inner: StackerModel | PanelModel):
    """The signature RAIM derives for a stacker or a panel model (its columns and votes)."""
    if isinstance(inner, StackerModel):
        return stacker_signature(inner.columns, inner.stacker.n_votes)
    return panel_signature(inner.columns, inner.stacker.n_votes or len(inner.columns))


def save_model(inner: StackerModel | PanelModel, folder: str | Path) -> Path:
    """``inner`` as a local MLflow model folder with its document (:mod:`src.mlops.artifact`): a folder
    ``python -m src.serve model`` and ``src.predict`` read by its ``--model-uri`` (a panel's ``config`` goes into the
    document)."""
    with _pins_from_this_environment(), tempfile.TemporaryDirectory() as tmp:
        doc = artifact.write(document_of(inner), tmp)
        mlflow.pyfunc.save_model(
            folder,
            python_model=inner,
            artifacts={"raim_model": str(doc)},
            signature=model_signature(inner),
            pip_requirements=pip_requirements(),
        )
    return Path(folder)


def stacker_signature(columns: list[str], n_votes: int | None = None):
    """Every column required (a vote: 0, 1, or null / 0.5 = abstained; then continuous features); the output's
    p and verdict are null for a row where every member abstained (its label is ``abstained``)."""
    from mlflow.models import ModelSignature  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.types import ColSpec, Schema  # imported here, not at start-up: mlflow ~1.8 s

    inputs = Schema([ColSpec("double", c, required=True) for c in columns])
    outputs = Schema(
        [
            ColSpec("double", "p_hallucinated", required=False),
            ColSpec("long", "verdict", required=False),
            ColSpec("string", "label"),
            ColSpec("double", "train_prevalence", required=False),
        ]
    )
    return ModelSignature(inputs=inputs, outputs=outputs, params=inference_params())


def inference_params():
    """The parameters a served model takes at inference: ``prevalence`` — the deployment's hallucinated share
    as text ("0.1"; MLflow types a parameter once, and it must also carry ``"estimate"``: the EM estimate over
    the request's rows, :mod:`src.studies.prevalence`); unset: the posteriors as fitted."""
    from mlflow.types import ParamSchema, ParamSpec  # imported here, not at start-up: mlflow ~1.8 s

    return ParamSchema([ParamSpec("prevalence", "string", None)])


def pip_requirements() -> list[str]:
    """Exact pins of what unpickling and running the models needs (inference of these is slow and wrong)."""
    import cloudpickle  # imported here, not at start-up: cloudpickle
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    import sklearn  # imported here, not at start-up: scikit-learn ~1.4 s

    return [
        f"mlflow=={mlflow.__version__}",
        f"scikit-learn=={sklearn.__version__}",
        f"numpy=={np.__version__}",
        f"pandas=={pd.__version__}",
        f"scipy=={__import__('scipy').__version__}",
        f"cloudpickle=={cloudpickle.__version__}",
    ]


def log_stacker(
    stacker,
    columns: list[str],
    example: pd.DataFrame | None = None,
    name: str = "stacker",
    decision: Mapping[str, Any] | None = None,
):
    """Log a fitted stacker as a pyfunc model in the active run; returns MLflow's ``ModelInfo``. ``decision``:
    the run's deployment decision (:func:`run_decision`), carried by the model and named in its metadata.

    The model must accept exactly its signature's columns and predict its own input example: checked before
    anything is logged (a stacker fitted on other columns than ``columns`` raises here, not at serving time)."""
    if example is None:
        example = pd.DataFrame([[1.0] * len(columns), [0.0] * len(columns)], columns=columns)
    example = example.head(5)
    model = StackerModel(stacker, columns, decision)
    n_in = getattr(stacker, "n_features_in_", len(columns))
    if n_in != len(columns) or list(example.columns) != list(columns):
        raise ValueError(
            f"stacker fitted on {n_in} columns cannot be logged with columns {list(columns)} "
            f"(example columns {list(example.columns)})"
        )
    model.predict(None, example)  # raises if the stacker cannot score its own example
    return _log_pyfunc(
        name,
        model,
        stacker_signature(columns, stacker.n_votes),
        example,
        code=[type(model).__module__, type(stacker).__module__],  # the model's code and the stacker's
        metadata={"columns": list(columns), "threshold": float(stacker.threshold), **_decision_metadata(decision)},
    )


def self_check(model_uri: str) -> str | None:
    """Why a logged stacker cannot serve (None: its document reads and checks — :func:`load_model`, nothing
    unpickled — and, served as MLflow's server would, it answers one row per row of votes: all hallucinated, all
    supported, all abstained)."""
    try:
        inner = load_model(model_uri)
        if not isinstance(inner, StackerModel):
            return f"it is a {type(inner).__name__}, not a stacker model"
        n, k = len(inner.columns), inner.stacker.n_votes or len(inner.columns)
        example = pd.DataFrame([[v] * k + [0.0] * (n - k) for v in (1.0, 0.0, ABSTAIN)], columns=inner.columns)
        out = pyfunc_model(inner).predict(example)
        if len(out) != len(example):
            return f"it answered {len(out)} rows for {len(example)}"
    except Exception as e:  # any failure to load or predict is the reason to refuse
        return f"it cannot be read or cannot predict ({type(e).__name__}: {' '.join(str(e).split())[:300]})"
    return None
