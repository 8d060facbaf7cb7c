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
  coordinates, the decision (tags ``decision``, ``decision_member``, ``decision_reason``: :mod:`src.core.decide`),
  the params that set the analysis apart (:data:`DISTINGUISHING`: MLflow's Compare separates a sweep's runs),
  hashes of the inputs, and the fitted stacker as a pyfunc model (:mod:`src.mlops.serving`).

Secrets are scrubbed from everything logged (:mod:`src.mlops.redact`); the store is :mod:`src.mlops.store`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from src.core.errors import RaimError
from src.core.ladderbase import design_matrix
from src.core.names import metric_name
from src.io import files
from src.io.config import flatten, option_name, thaw, to_yaml
from src.io.files import sha256_file, sha256_tree, to_json
from src.io.paths import ROOT
from src.io.settings import Settings
from src.judges.cache import dataset_folder
from src.mlops.redact import scrub, scrub_text
from src.mlops.store import (
    PROCESS_TAG,
    close_orphans,
    process_tag,
    quiet_mlflow,
    setup,
    store_errors,
    store_failure,
    tracking_uri,
)

PARENT_ENV = "RAIM_MLFLOW_PARENT_RUN_ID"


NAMED_GROUPS = ("roster", "dataset", "frame")  # named by their own ``name`` value
VALUE_GROUPS = ("stacker", "analysis", "suite")  # named by the conf/<group> option whose values they hold


def byo_verdicts(data: Mapping) -> str | None:
    """The bring-your-own verdict table a run analyses (``verdicts=PATH``): no roster judged it."""
    v = data.get("verdicts")
    return str(v) if v else None


def choices(cfg: Settings) -> dict[str, str]:
    """What a run analysed, as tags read off the config's values: the roster (none for a bring-your-own verdict
    table: ``verdicts`` instead), the dataset(s) and the frame by name; the stacker, analysis and suite settings
    by the conf option they match (:func:`option_name`)."""
    data = thaw(cfg.composed)
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
        sha = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        dirty = (
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
            != ""
        )
        return sha, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def table_hash(table) -> str:
    """Content hash of a verdict table (the on-disk contract, rows in their order)."""
    return hashlib.sha256(table.to_frame().to_csv(index=False).encode()).hexdigest()


def input_hashes(cfg: Settings, table, dataset: str | None = None) -> dict[str, str]:
    """Hashes of what an analysis read: the verdict table, the balanced set(s) and the verdict cache."""
    out = {"verdict_table_sha256": table_hash(table)}
    if cfg.verdicts:
        p = Path(cfg.verdicts)
        if p.is_file():
            out["verdicts_file_sha256"] = sha256_file(p)
        return out
    names = [dataset] if dataset else list(dict.fromkeys(table.items["dataset"]))
    ddir = Path(cfg.paths.datasets_dir)
    bal = sha256_tree(ddir / f"{n}.jsonl" for n in names)
    if bal:
        out["balanced_set_sha256"] = bal
    cdir = Path(cfg.paths.cache_dir)
    members = [str(m) for m in table.members]
    if table.frontier_name:
        members.append(table.frontier_name)
    cache = sha256_tree(cdir / dataset_folder(n) / m for n in names for m in members)
    if cache:
        out["verdict_cache_sha256"] = cache
    return out


# ---------------------------------------------------------------------------------------------- runs


def base_tags(cfg: Settings, kind: str) -> dict[str, str]:
    """The tags every run of ``kind`` carries: the run's choices (:func:`choices`) and git's commit."""
    return RunContext.read(cfg, with_config=False).tags(kind)


@dataclass(frozen=True)
class RunContext:
    """What the runs of one analysis share, read once off its config (each read resolves and scans the whole
    config, and asks git twice): the choices, git's commit and whether the tree is dirty, and the scrubbed config
    the parent run logs (:func:`run_config`; empty when read ``with_config=False``)."""

    picked: dict[str, str]
    commit: tuple[str | None, bool | None]
    config: dict = field(default_factory=dict)

    @classmethod
    def read(cls, cfg: Settings, with_config: bool = True) -> RunContext:
        return cls(choices(cfg), git_commit(), run_config(cfg) if with_config else {})

    def tags(self, kind: str) -> dict[str, str]:
        tags = {"kind": kind, **self.picked}
        sha, dirty = self.commit
        if sha:
            tags.update({"git_commit": sha, "mlflow.source.git.commit": sha, "git_dirty": str(dirty).lower()})
        return tags


def _sweep_parent(cfg: Settings, exp_id: str) -> str | None:
    """In a Hydra multirun, the id of the sweep's parent run (created by the first job that asks)."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

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
    found = mlflow.search_runs(
        [exp_id],
        filter_string=f"tags.sweep_dir = '{sweep_id}' and tags.kind = 'sweep'",
        output_format="list",
        max_results=1,
    )
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
def start_run(
    cfg: Settings,
    kind: str,
    tags: dict | None = None,
    nested: bool = False,
    run_name: str | None = None,
    context: RunContext | None = None,
) -> Iterator[Any]:
    """Open a tagged run with the composed config logged as params (secrets scrubbed); yields the run.

    Nested under the active run if there is one; inside a Hydra multirun with no active run, nested under the
    sweep's parent run (``$RAIM_MLFLOW_PARENT_RUN_ID`` names a parent explicitly). ``nested`` is accepted for
    symmetry with ``mlflow.start_run``: with no parent to nest under, the run is a top-level one. ``context``:
    the config's tags and logged config, read once for many runs (default: read off ``cfg`` for this one).
    """
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    exp_id = setup(cfg.tracking)
    base = context.tags(kind) if context is not None else base_tags(cfg, kind)
    all_tags = {**base, **{k: str(v) for k, v in (tags or {}).items()}}
    all_tags = scrub(all_tags)  # key-aware: git_commit and *_sha256 keep their hashes
    all_tags[PROCESS_TAG] = process_tag()  # a run this process leaves RUNNING is closed by the next one
    active = mlflow.active_run()
    swept = sweep_job_overrides() if kind != "sweep" else ""
    if active is None:
        with store_errors(tracking_uri(cfg.tracking)):
            close_orphans(tracking_uri(cfg.tracking))
    kwargs: dict[str, Any] = {
        "experiment_id": exp_id,
        "tags": all_tags,
        "run_name": " ".join(p for p in (run_name or default_run_name(kind, all_tags), swept) if p),
    }
    if active is not None:
        kwargs["nested"] = True
    elif kind != "sweep":
        parent = _sweep_parent(cfg, exp_id)
        if parent:
            kwargs["parent_run_id"] = parent
            kwargs["nested"] = True
    with store_errors(tracking_uri(cfg.tracking)), mlflow.start_run(**kwargs) as run:
        if active is None:  # children inherit the parent's config: log it once
            data = context.config if context is not None and context.config else run_config(cfg)
            mlflow.log_params(flatten(data))
            with tempfile.TemporaryDirectory() as tmp:
                p = Path(tmp) / "config.yaml"
                p.write_text(to_yaml(data))
                mlflow.log_artifact(str(p))
        yield run


def default_run_name(kind: str, tags: Mapping[str, str]) -> str:
    """A run's name in the MLflow UI: ``<kind>/<roster>/<dataset>`` read off its tags (``stacking/cpu/wice``;
    a bring-your-own verdict table stands where the roster would, ``stacking/verdicts=v.csv/all``; a run with
    no dataset drops that part), so the runs table says what each run analysed without opening it."""
    who = tags.get("roster") or (f"verdicts={Path(tags['verdicts']).name}" if tags.get("verdicts") else None)
    return "/".join(p for p in (kind, who, tags.get("dataset")) if p)


SWEPT_NAME_MAX = 160  # characters of a run name given to a sweep job's overrides (MLflow keeps 250 in all)


def sweep_job_overrides(argv: list[str] | None = None) -> str:
    """In a Hydra multirun job, the overrides that set this job apart from the sweep's others, for its run names
    (``stacker.C=0.1`` of ``-m stacker.C=0.1,1``): the job's overrides of the keys the command line sweeps (all of
    the job's overrides when none is read as a sweep there, e.g. a sweeper configured in a file), secrets
    scrubbed; '' outside a sweep."""
    # imported here, not at start-up: Hydra's parser (~0.09 s), which src.predict and the server do without
    from hydra.core.hydra_config import HydraConfig  # imported here, not at start-up: as above
    from hydra.core.override_parser.overrides_parser import OverridesParser  # imported here, not at start-up: as above
    from hydra.types import RunMode  # imported here, not at start-up: as above

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    parser = OverridesParser.create()

    def parsed(texts: Iterable[str]) -> list:
        out = []
        for text in texts:  # a flag or a flag's value is not an override: left out
            with contextlib.suppress(Exception):
                out.append(parser.parse_override(text))
        return out

    job = parsed(HydraConfig.get().overrides.task)
    keys = {o.key_or_group for o in parsed(sys.argv[1:] if argv is None else argv) if o.is_sweep_override()}
    picked = [o.input_line for o in job if not keys or o.key_or_group in keys]
    text = scrub_text(" ".join(str(t) for t in picked))
    return text if len(text) <= SWEPT_NAME_MAX else text[: SWEPT_NAME_MAX - 1] + "…"


def run_config(cfg: Settings) -> dict:
    """The composed config a run logs, secrets scrubbed; without the roster for a bring-your-own verdict table
    (no roster judged it)."""
    data = scrub(thaw(cfg.composed))
    if byo_verdicts(data):
        data.pop("roster", None)
    return data


# Per dataset run: the values that tell one analysis from another (a sweep's stacker and analysis settings, the
# frame, the roster or the bring-your-own table, the subsample), so that MLflow's Compare separates the runs.
DISTINGUISHING = (
    "stacker",
    "analysis",
    "frame.name",
    "roster.name",
    "verdicts",
    "frontier",
    "judge.per_dataset",
    "judge.missing",
)


def distinguishing_params(data: Mapping) -> dict[str, str]:
    """:data:`DISTINGUISHING` of a run's logged config (:func:`run_config`) as MLflow params (dotted keys, as on
    the parent run)."""
    out: dict[str, str] = {}
    for key in DISTINGUISHING:
        node = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            out.update(flatten(node, f"{key}."))
    return out


def log_figures(paths: Iterable[str | Path], artifact_path: str = "figures") -> list[str]:
    """Log figure files (PNG/PDF/SVG…) of the active run; returns the logged file names."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    logged = []
    for p in map(Path, paths):
        if p.is_file():
            mlflow.log_artifact(str(p), artifact_path=artifact_path)
            logged.append(p.name)
    return logged


def log_metrics(
    metrics: Mapping[str, float],
    series: Mapping[str, Iterable[float]] | None = None,
    model_id: str | None = None,
    params: Mapping[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
) -> None:
    """The active run's metrics in one batch (one store transaction, not one per metric): ``metrics`` at step 0,
    each of ``series`` as one value per step (e.g. β per fold, step = fold). ``model_id``: the step-0 metrics
    are also the metrics of that logged model (what MLflow's ``log_model`` does for metrics logged before it,
    at one query per metric name). ``params`` and ``tags`` go in the same batch."""

    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.entities import Metric, Param, RunTag  # imported here, not at start-up: mlflow ~1.8 s

    ts = int(time.time() * 1000)
    rows = [Metric(k, float(v), ts, 0, model_id=model_id) for k, v in metrics.items()]
    rows += [
        Metric(k, float(v), ts, i, model_id=None if i else model_id)
        for k, vals in (series or {}).items()
        for i, v in enumerate(vals)
    ]
    mlflow.MlflowClient().log_batch(
        mlflow.active_run().info.run_id,
        metrics=rows,
        params=[Param(k, str(v)) for k, v in (params or {}).items()],
        tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
    )


def log_json(obj: Any, name: str) -> None:
    """A JSON artifact of the active run (secrets scrubbed)."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    mlflow.log_text(to_json(scrub(obj), default=str), name)


def run_study(
    cfg: Settings, kind: str, compute, output: str | Path, figure: str | Path, draw, metrics, tags=None, series=None
) -> tuple[dict, Path, Path]:
    """A study entry (``python -m src.<kind>``), in the order that loses nothing: both output paths checked (the
    settings ``cfg`` were checked by the entry: :func:`src.studies.checked.check_config`) before any work, then
    ``compute(cfg)`` → document, ``draw(doc, figure)`` → figure, the MLflow run of kind ``kind``
    (``metrics(doc)``, ``series(doc)`` per step, ``tags(doc)``, the document and the figure) when tracking is on,
    and the JSON last, so that a failed tracking leaves the previous JSON in place (its store's failure one line:
    :func:`tracking_errors`). Returns (doc, JSON, figure)."""

    for path in (output, figure):
        files.check_output(path)
    doc = compute(cfg)
    fig = draw(doc, figure)
    if cfg.tracking.enabled:
        with tracking_errors(cfg, Path(output).name), start_run(cfg, kind, tags=tags(doc) if tags else None):
            log_metrics(metrics(doc), series=series(doc) if series else None)
            log_json(doc, f"{kind}.json")
            log_figures([fig])
    return doc, files.write_json(doc, output), fig


# ---------------------------------------------------------------------------------------------- analysis


def summary_metrics(s: dict) -> tuple[dict[str, float], dict[str, str]]:
    """One dataset's summary → (metrics, tags): comparators with CI bounds, deltas, members, admissibility."""
    metrics: dict[str, float] = {
        "n": s["n"],
        "n_clusters": s["n_clusters"],
        "abstention_rate": s["abstentions"]["rate"],
    }
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
    """The deployment decision (:mod:`src.core.decide`) as tags: ``decision`` (panel / single / none),
    ``decision_member`` (the single judge, or ``none``), ``decision_reason``."""
    if not d:
        return {}
    return {"decision": d["action"], "decision_member": d["member"] or "none", "decision_reason": d["reason"]}


def beta_table(s: dict):
    """β per stacker feature: fold-mean, each fold, and the refit on all items (a DataFrame)."""
    import pandas as pd  # imported here, not at start-up: pandas ~0.5 s

    st = s["stacker"]
    df = pd.DataFrame({"feature": list(st["beta_mean"]), "mean": list(st["beta_mean"].values())})
    for i, fold in enumerate(st["beta_folds"]):
        df[f"fold{i}"] = df["feature"].map(fold)
    df["full"] = df["feature"].map(st["beta_full"])
    return df


def stacker_example(table, result, rows: int = 5):
    """Input example of the served stacker: the first rows of the dataset's design matrix, over exactly the
    members the stacker was fitted on (``result.members``: a member that never voted on the dataset is not one)."""
    import pandas as pd  # imported here, not at start-up: pandas ~0.5 s

    fitted = table.subset(np.ones(len(table.gold), bool), list(result.members))
    extras = [f for f in result.feature_names if "@" in f]
    X, names = design_matrix(fitted, list(dict.fromkeys(e.split("@", 1)[1] for e in extras)))
    return pd.DataFrame(X[:rows], columns=list(fitted.members) + names)


def log_dataset(
    cfg: Settings, table, name: str, result, summary: dict | None = None, context: RunContext | None = None
) -> str:
    """The active (child) run ← one dataset's ladder and decision (``summary``: its results.json entry; default
    the ladder's summary), the params that set it apart, β table, hashes and the fitted stacker model."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    s = summary or result.summary
    metrics, tags = summary_metrics(s)
    # the model first, then its metrics in one batch carrying its id (logged after the metrics, MLflow would
    # copy each onto the model with one history query per metric name)
    # only a tracked run logs a model: the pyfunc module (mlflow.pyfunc, ~0.8 s) is not part of the start-up
    from src.mlops import packaging  # imported here, not at start-up: mlflow.pyfunc ~0.8 s

    example = stacker_example(table, result)
    info = packaging.log_stacker(result.stacker, list(example.columns), example, decision=s.get("decision"))
    folds = s["stacker"]["beta_folds"]  # β per fold as a series (step = fold)
    log_metrics(  # metrics, params and tags: one transaction
        metrics,
        {metric_name("beta_fold", k): [f[k] for f in folds] for k in (folds[0] if folds else {})},
        model_id=info.model_id,
        params=distinguishing_params(context.config if context is not None else run_config(cfg)),
        tags={**tags, **input_hashes(cfg, table, name), "stacker_model_uri": info.model_uri},
    )
    mlflow.log_text(beta_table(s).to_csv(index=False), "beta.csv")
    log_json(s, "summary.json")
    return info.model_uri


def log_analysis(cfg: Settings, table, results: dict, doc: dict, kind: str = "stacking") -> str:
    """One run per analysis (results.json, hashes, mean κ, the verdict cache's report), one nested child per
    dataset; returns its id. A failure of the tracking store is a :class:`RaimError` naming the store."""
    with tracking_errors(cfg), quiet_mlflow():
        return _log_analysis(cfg, table, results, doc, kind)


@contextlib.contextmanager
def tracking_errors(cfg: Settings, kept: str = "results") -> Iterator[None]:
    """A failure of the tracking store inside the block raised as :func:`tracking_failure`'s one line (``kept``:
    the output that was not written); any other exception as it is."""
    try:
        yield
    except Exception as e:
        err = tracking_failure(cfg, e, kept)
        if err is None:
            raise
        raise err from e


def tracking_failure(cfg: Settings, e: Exception, kept: str = "results") -> RaimError | None:
    """The one line for a failure of the tracking store (MLflow's own errors and those of its sqlite store: a
    locked or corrupt mlflow.db, a store that cannot be made, a failed migration); None for any other exception (a
    bug: raised as it is)."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    why = store_failure(e)  # one line, without the SQL statement
    if why is None and not isinstance(e, (MlflowException, OSError, ImportError)):
        return None
    return RaimError(
        f"MLflow tracking at {tracking_uri(cfg.tracking)} failed ({type(e).__name__}: {why or e}); nothing was "
        f"written to {kept} (tracking.enabled=false runs without MLflow)"
    )


def _log_analysis(cfg: Settings, table, results: dict, doc: dict, kind: str) -> str:
    by = table.by_dataset()
    context = RunContext.read(cfg)  # once for the parent and every child
    parent = f"{default_run_name(kind, context.tags(kind))} ({len(results)} dataset{'s' if len(results) != 1 else ''})"
    with start_run(cfg, kind, context=context, run_name=parent) as run:  # its children: <kind>/<roster>/<dataset>
        decisions = {n: s["decision"]["label"] for n, s in doc["datasets"].items() if "decision" in s}
        tags = {
            **input_hashes(cfg, table),
            "datasets": ",".join(results),
            "decisions": "; ".join(f"{n}: {d}" for n, d in decisions.items()),
        }
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
        log_metrics(metrics, tags=tags)
        for name, result in results.items():  # each child named stacking/<roster>/<dataset>
            with start_run(cfg, kind, tags={"dataset": name}, nested=True, context=context):
                log_dataset(cfg, by[name], name, result, doc["datasets"].get(name), context)
        return run.info.run_id
