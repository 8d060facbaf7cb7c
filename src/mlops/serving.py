"""MLflow pyfunc models that RAIM serves.

* :class:`StackerModel` wraps a fitted :class:`src.core.aggregate.StackedLogit` (the per-dataset meta-learner of §2).
  Input: one column per panel member holding its verdict (1 = hallucinated, 0 = supported, 0.5 or null =
  abstained). Output: ``p_hallucinated`` (the stacker's probability), ``verdict`` (1 iff p ≥ threshold) and
  ``label``. This is what ``mlflow models serve`` answers.
* :class:`PanelModel` takes raw items (question, evidence, candidate), runs the configured roster's judges
  through the verdict cache (a hit never loads a model) and stacks their verdicts with a fitted stacker.

Both take their inputs strictly (:class:`InputError`: one line naming the row and the column), record what they
scored for live monitoring (:mod:`src.mlops.recording`) and carry the deployment decision of the run that fitted
them. How MLflow logs, saves and loads them (their document, signatures, code and pins) is
:mod:`src.mlops.packaging`; ``python -m src.serve model`` serves either behind MLflow's scoring server with strict
inputs (:mod:`src.mlops.server`). Logging and registering them is :mod:`src.mlops.tracking`'s and
:mod:`src.mlops.registry`'s: both import these modules, which import neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
import yaml

from src.core.detector import flag_column
from src.core.errors import RaimError
from src.core.injection import DEFAULT_DEFENCE, ESCALATED, check_defence, defended, immune_design
from src.core.priorshift import PrevalenceError, served
from src.core.textfiles import normal_id
from src.core.verdicts import ABSTAIN, at_or_over
from src.io.paths import CONF_DIR, ROOT
from src.judges.cache import item_content_hash
from src.judges.config import instruction_immune, resolve_roster
from src.judges.runner import verdict_table
from src.mlops.recording import monitored, record_injection_flags, record_votes
from src.mlops.redact import resolved

SCORED_CACHE = ROOT / "verdicts" / "scored"  # new items' verdicts: not the committed benchmark cache (a DVC dependency)


OUTPUT_COLUMNS = ("p_hallucinated", "verdict", "label", "train_prevalence")


ITEM_INPUT = ("item_id", "question", "evidence", "candidate")


PANEL_OPTIONAL = ("question", "evidence", "item_id", "frame", "dataset")


class InputError(RaimError, ValueError):
    """A scoring request that does not match the model's inputs; one line naming the row and the column."""


def check_columns(given: Iterable[str], columns: list[str], where: str = "") -> None:
    """Exactly the model's columns: an unknown (e.g. misspelt) or a missing member column is an error; a member
    that abstained is given as null or 0.5, never by leaving its column out."""
    given = list(given)
    unknown = [c for c in given if c not in columns]
    missing = [c for c in columns if c not in given]
    if unknown or missing:
        parts = ([f"unknown column(s) {unknown}"] if unknown else []) + (
            [f"missing column(s) {missing}"] if missing else []
        )
        raise InputError(
            f"{where}{' and '.join(parts)}; the model takes exactly {columns} (a member that abstained: null or 0.5)"
        )


def _number(v: Any) -> float | None:
    """A JSON/pandas scalar as a float; None for a null; raises TypeError for anything else."""
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError
    return float(v)


def votes_from_rows(rows: list[Mapping[str, Any]], columns: list[str], n_votes: int | None = None) -> np.ndarray:
    """The stacker's input matrix from request rows (1-based row numbers in every error): a vote is 0, 1, or
    0.5 / null (abstained); columns past ``n_votes`` are continuous features (finite numbers, never null)."""

    k = len(columns) if n_votes is None else n_votes
    if not rows:
        raise InputError("no rows to score")
    X = np.empty((len(rows), len(columns)))
    for r, row in enumerate(rows, 1):
        if not isinstance(row, Mapping):
            raise InputError(f"row {r}: expected an object of member columns, got {type(row).__name__}")
        check_columns(row.keys(), columns, f"row {r}: ")
        for j, c in enumerate(columns):
            try:
                x = _number(row[c])
            except TypeError:
                x = "bad"
            vote_ok = x is None or x in (0.0, 1.0, ABSTAIN)
            if (j < k and not vote_ok) or (j >= k and (x is None or x == "bad" or not np.isfinite(x))):
                want = "a vote: 0, 1, or 0.5 / null (abstained)" if j < k else "a finite number"
                shown = f"{x:g}" if isinstance(x, float) else repr(row[c])[:40]
                raise InputError(f"row {r}: column {c!r}: {shown} is not {want}")
            X[r - 1, j] = ABSTAIN if x is None else x
    return X


def vote_matrix(frame: pd.DataFrame, columns: list[str], n_votes: int | None = None) -> np.ndarray:
    """:func:`votes_from_rows` over a DataFrame (its columns checked first: exactly the model's)."""
    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame)
    check_columns(frame.columns, columns)
    return votes_from_rows(frame.to_dict("records"), columns, n_votes)


def stacked_output(stacker, X: np.ndarray, prevalence: Any = None) -> pd.DataFrame:
    """p(hallucinated), verdict and label per row; a row where every member abstained has no verdict: its
    p and verdict are null and its label is ``abstained`` (the intercept alone is not an answer).
    ``train_prevalence``: the hallucinated share the row's p assumes (the stacker's training prevalence, or the
    corrected prevalence), what :mod:`src.studies.estimate` needs for its label-free EM estimate.
    ``prevalence`` (the inference parameter): p under that deployment prevalence, or ``"estimate"`` its EM
    estimate over the batch's answered rows (:func:`src.studies.prevalence.served`); the verdict is then corrected
    p ≥ threshold. ``attrs``: the prevalence used and the uncorrected p."""

    k = X.shape[1] if stacker.n_votes is None else stacker.n_votes
    none = (X[:, :k] == ABSTAIN).all(axis=1)
    p_fit = stacker.predict_proba(X)[:, 1]
    p = p_fit.copy()
    try:
        p[~none], used = served(p_fit[~none], stacker, prevalence)
    except PrevalenceError as e:
        raise _invalid(InputError(str(e))) from None
    verdict = at_or_over(p, stacker.threshold).astype(int)
    label = np.where(none, "abstained", np.where(verdict == 1, "hallucinated", "supported"))
    fitted = getattr(stacker, "train_prevalence_", None)  # None: a stacker fitted before RAIM recorded it
    prior = used if used is not None else fitted
    out = pd.DataFrame(
        {
            "p_hallucinated": pd.array(np.where(none, np.nan, p), dtype="Float64"),
            "verdict": pd.array([pd.NA if n else int(v) for n, v in zip(none, verdict)], dtype="Int64"),
            "label": label,
            "train_prevalence": pd.array([prior] * len(p), dtype="Float64"),
        }
    )
    out.attrs.update(prevalence=used, p_uncorrected=np.where(none, np.nan, p_fit), train_prevalence=fitted)
    return out


def _invalid(e: InputError):
    """An MLflow error the scoring server answers with HTTP 400 and this one line (no stack trace)."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE  # imported here, not at start-up: mlflow ~1.8 s

    return MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE)


def run_decision(decision: Mapping[str, Any] | None) -> dict | None:
    """The deployment decision of the run that fitted a stacker (:mod:`src.core.decide`: ``action`` panel /
    single / none, its ``label`` and ``reason``), as a model carries it; None when unknown."""
    if not decision or not decision.get("action"):
        return None
    return {k: (None if decision.get(k) is None else str(decision[k])) for k in ("action", "label", "reason")}


def decision_warning(decision: Mapping[str, Any] | None) -> str | None:
    """One line when a model's own run did not decide to deploy the panel (§3.3: an inadmissible panel, or one
    that does not pay against the CV-best single judge, is not a deployment); None when it did, or is unknown."""
    d = run_decision(decision)
    if d is None or d["action"] == "panel":
        return None
    return (
        f"this model's run decided {d['label']!r}, not 'deploy the panel' ({d['reason']}); its verdicts are "
        f"not a deployment RAIM recommends (each output row says so in 'run_decision')"
    )


def mark_decision(out: pd.DataFrame, decision: Mapping[str, Any] | None) -> pd.DataFrame:
    """``out`` with a ``run_decision`` column (the run's decision label) when that run did not decide to deploy
    the panel; unchanged otherwise (a promoted model always did)."""
    if decision_warning(decision) is not None:
        out["run_decision"] = run_decision(decision)["label"]
    return out


class StackerModel(mlflow.pyfunc.PythonModel):
    """A fitted stacker over member verdicts → p(hallucinated) and the verdict.

    ``decision``: the deployment decision of the run that fitted it (:func:`run_decision`); when it is not
    "deploy the panel", every output row carries it in a ``run_decision`` column."""

    _skip_type_hint_validation = True  # the explicit signature validates inputs (MLflow warns otherwise)

    def __init__(self, stacker, columns: list[str], decision: Mapping[str, Any] | None = None):
        self.stacker = stacker
        self.columns = list(columns)
        self.decision = run_decision(decision)

    def __getstate__(self) -> dict:
        return persistent_state(self)

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> pd.DataFrame:
        try:
            X = vote_matrix(model_input, self.columns, self.stacker.n_votes)
        except InputError as e:
            raise _invalid(e) from None
        out = stacked_output(self.stacker, X, (params or {}).get("prevalence"))
        why = record_votes(params, "stacker", self.columns, X, self.stacker.n_votes, out)
        out = monitored(self, params, out, why)
        return mark_decision(out, getattr(self, "decision", None))  # a model pickled before it carried one: None


TRANSIENT = ("_live_roster", "_monitor_health")  # a model's per-process state, never pickled


def persistent_state(model) -> dict:
    """A served model's attributes as pickled: without its :data:`TRANSIENT` state (a resolved secret, the
    monitor's counts of this process)."""
    return {k: v for k, v in model.__dict__.items() if k not in TRANSIENT}


class PanelModel(mlflow.pyfunc.PythonModel):
    """Raw items → the roster's judges (through the verdict cache) → the stacked verdict.

    Input columns: ``candidate`` (required), ``question``, ``evidence``, ``item_id``, ``frame``, ``dataset``.
    An item without ``item_id`` gets one from its content, so a repeated item is a cache hit; an item without
    ``frame`` is scored under the model's default frame. ``model_config`` (overridable at load time):
    ``cache_dir`` (the verdict cache), ``compute`` (score cache misses; False: a miss is an abstention, named in
    the ``uncached`` output column). Output: ``item_id``, one column per member (its vote; null = abstained),
    ``p_hallucinated``, ``verdict``, ``label``, ``uncached`` (comma-separated members whose verdict was neither
    cached nor computed; empty when every member judged), ``injection_flag`` / ``injection_reasons``
    (:func:`src.core.detector.scan`: the item's text looks like a prompt injection aimed at the judges). The
    roster holds exactly the members the stacker votes with, in its column order. ``decision``: that of the
    stacker's run, as in :class:`StackerModel` (a ``run_decision`` column when it is not "deploy the panel").

    The roster is kept as :func:`src.mlops.redact.persistable` makes it: a secret stays the reference it is in
    the roster (``${oc.env:RAIM_OPENAI_API_KEY,null}``), so the pickled model holds no key; it is resolved from
    the serving environment when the model is loaded (:meth:`load_context`, or at the first prediction of a
    model built in-process) and that resolved copy is never pickled.
    """

    _skip_type_hint_validation = True

    def __init__(
        self,
        roster: dict,
        frames: dict[str, dict],
        default_frame: str,
        stacker,
        columns: list[str],
        decision: Mapping[str, Any] | None = None,
    ):
        self.roster = roster
        self.frames = frames
        self.default_frame = default_frame
        self.stacker = stacker
        self.columns = list(columns)
        self.config: dict = {}
        self.decision = run_decision(decision)

    def load_context(self, context) -> None:
        self.config = dict(getattr(context, "model_config", None) or {})
        self._live_roster = resolved(self.roster, f"panel model (roster {self.roster.get('name')!r})")

    def live_roster(self) -> dict:
        """The roster with its references resolved from this process's environment."""
        if getattr(self, "_live_roster", None) is None:
            self._live_roster = resolved(self.roster, f"panel model (roster {self.roster.get('name')!r})")
        return self._live_roster

    def __getstate__(self) -> dict:
        return persistent_state(self)  # never pickle a resolved key

    def items(self, frame: pd.DataFrame) -> pd.DataFrame:

        df = pd.DataFrame(frame).copy()
        unknown = [c for c in df.columns if c not in ("candidate", *PANEL_OPTIONAL)]
        if unknown:
            raise InputError(
                f"unknown column(s) {unknown}; a panel model takes 'candidate' and optionally {list(PANEL_OPTIONAL)}"
            )
        if "candidate" not in df:
            raise InputError("each item needs a 'candidate' (the text to judge)")
        check_item_cells(df, self.frames)
        bad = df["candidate"].isna() | (df["candidate"].astype(str).str.strip() == "")
        if bad.any():
            raise InputError(f"row {int(np.flatnonzero(bad.to_numpy())[0]) + 1}: column 'candidate': empty")
        for c in ("question", "evidence"):
            if c not in df:
                df[c] = ""
            df[c] = df[c].fillna("").astype(str)
        ids = [f"item-{item_content_hash(r)}" for r in df[["question", "evidence", "candidate"]].to_dict("records")]
        df["item_id"] = df["item_id"].fillna(pd.Series(ids)).astype(str).map(normal_id) if "item_id" in df else ids
        df["frame"] = df["frame"].fillna(self.default_frame) if "frame" in df else self.default_frame
        df["dataset"] = df["dataset"].fillna("served") if "dataset" in df else "served"
        df["cluster_id"] = df["item_id"]
        first: dict[str, int] = {}
        for r, i in enumerate(df["item_id"], 1):
            if first.setdefault(i, r) != r:
                raise InputError(
                    f"row {r}: column 'item_id': {i!r} repeats row {first[i]} (one request scores an "
                    "item once; without an item_id, an item's id is its content's hash)"
                )
        return df

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> pd.DataFrame:

        cfg = {**self.config, **(params or {})}
        try:
            items = self.items(model_input)
        except InputError as e:
            raise _invalid(e) from None
        compute = bool(cfg.get("compute", True))
        table = verdict_table(
            self.live_roster(),
            items,
            self.frames,
            Path(cfg.get("cache_dir", SCORED_CACHE)),
            compute=compute,
            progress=False,
            allow_empty=not compute,
        )  # a miss abstains
        self.last_report = table.attrs.get("report", {})
        votes = table[self.columns].reset_index(drop=True)  # nullable: an abstention is null, never NaN
        X = vote_matrix(votes.astype("Float64").astype(float), self.columns, self.stacker.n_votes)
        out = stacked_output(self.stacker, X, cfg.get("prevalence"))
        cached = table.attrs.get("cached", {})
        out["uncached"] = [",".join(m for m in cached if not cached[m][i]) for i in range(len(out))]
        why = record_votes(cfg, "panel", self.columns, X, self.stacker.n_votes, out, items["item_id"].tolist())
        out["injection_flag"], out["injection_reasons"] = flag_column(items.to_dict("records"))
        why = record_injection_flags(cfg, items["item_id"].tolist(), out) if why is None else why
        policy = check_defence(cfg.get("injection_defence", DEFAULT_DEFENCE), "panel model config injection_defence")
        out = defend(out, X, self.stacker, instruction_immune(self.roster), policy)
        out = mark_decision(monitored(self, cfg, out, why), getattr(self, "decision", None))
        return pd.concat([items[["item_id"]].reset_index(drop=True), votes, out], axis=1)


def defend(out: pd.DataFrame, X: np.ndarray, stacker, immune: list[bool], policy: str) -> pd.DataFrame:
    """The decision path's defence (:func:`src.core.injection.defended`) on a panel's output: a flagged item
    (``injection_flag``) is escalated — no p, no verdict, label ``escalated`` —, or decided by the members no
    instruction can address (``immune``: the stacker on :func:`src.core.injection.immune_design`), or decided as
    any item (``off``). ``injection_action`` says which: ``escalated``, ``immune``, ``flagged`` (off), '' (not
    flagged)."""
    flagged = out["injection_flag"].to_numpy(dtype=bool)
    out["injection_action"] = ""
    if not flagged.any():
        return out
    if policy == "off":
        out.loc[flagged, "injection_action"] = "flagged"
        return out
    k = stacker.n_votes or X.shape[1]
    alt = None
    if policy == "immune" and any(immune):
        alt_out = stacked_output(stacker, immune_design(X, immune, k))
        alt = alt_out["verdict"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    verdict, escalated = defended(
        out["verdict"].astype("Float64").to_numpy(dtype=float, na_value=np.nan), flagged, policy, alt
    )
    by_immune = flagged & ~escalated
    if by_immune.any():
        out.loc[by_immune, "p_hallucinated"] = alt_out["p_hallucinated"][by_immune].to_numpy()
        out.loc[by_immune, "verdict"] = [int(v) for v in verdict[by_immune]]
        out.loc[by_immune, "label"] = np.where(verdict[by_immune] == 1, "hallucinated", "supported")
        out.loc[by_immune, "injection_action"] = "immune"
    out.loc[escalated, "p_hallucinated"] = pd.NA
    out.loc[escalated, "verdict"] = pd.NA
    out.loc[escalated, "label"] = ESCALATED
    out.loc[escalated, "injection_action"] = ESCALATED
    return out


def check_item_cells(df: pd.DataFrame, frames: Mapping[str, Any]) -> None:
    """A panel request's cells: ``candidate``, ``question``, ``evidence`` and ``dataset`` are texts (a number or a
    list is not judged as its printed form), ``item_id`` a text or an integer, ``frame`` one of the model's
    frames; all but ``candidate`` may be null. The first bad cell is an :class:`InputError` naming row and column."""
    kinds = {
        "candidate": (str,),
        "question": (str,),
        "evidence": (str,),
        "dataset": (str,),
        "frame": (str,),
        "item_id": (str, int, np.integer),
    }
    for c, ok in kinds.items():
        if c not in df:
            continue
        for r, v in enumerate(df[c].tolist(), 1):
            if v is None or (isinstance(v, float) and np.isnan(v)):
                continue
            if isinstance(v, bool) or not isinstance(v, ok):
                want = "a text or an integer" if c == "item_id" else "a text"
                raise InputError(f"row {r}: column {c!r}: {type(v).__name__} {str(v)[:40]!r} is not {want}")
            if c == "frame" and v not in frames:
                raise InputError(
                    f"row {r}: column 'frame': {v[:60]!r} is not one of the model's frames {sorted(frames)}"
                )


def frame_configs() -> dict[str, dict]:
    """Every prompt frame under conf/frame, as plain data (baked into a panel model)."""

    out = {}
    for p in sorted((CONF_DIR / "frame").glob("*.yaml")):
        node = yaml.safe_load(p.read_text())
        if isinstance(node, dict) and node.get("name", p.stem) != "auto":
            out[p.stem] = node
    return out


def panel_roster(
    roster: Mapping[str, Any], columns: list[str], n_votes: int | None, drop_frontier: bool = False
) -> dict:
    """``roster`` cut to exactly the members the stacker votes with, in its column order (e.g. on a dataset where
    some members never voted, they are not inputs); names the stacker columns the roster lacks. The roster is
    checked first and its ``drop_members`` applied (:func:`src.judges.config.resolve_roster`)."""
    roster = resolve_roster(roster, resolve=False)
    votes = list(columns[: n_votes or len(columns)])
    by_name = {m["name"]: m for m in roster["members"]}
    absent = [c for c in votes if c not in by_name]
    if absent:
        raise RaimError(
            f"the stacker votes with member(s) {absent} that roster {roster.get('name')!r} does not have "
            f"(its members: {list(by_name)})"
        )
    kept = {k: v for k, v in roster.items() if not (drop_frontier and k == "frontier")}
    return {**kept, "members": [by_name[c] for c in votes]}
