"""Registry and panel models for RAIM's stackers: promote only where the panel pays (§2, §3.3); log-panel.

A run's calibrated stacker goes to the MLflow model registry only when RAIM's decision is to deploy the panel;
``log-panel`` wraps a logged stacker with its roster's judges as a panel model.

    python -m src.registry promote --run-id RUN [--dataset NAME] [--name NAME] [--alias champion]
    python -m src.registry show --name NAME
    python -m src.registry log-panel --roster NAME --stacker-uri URI [--default-frame claim] [--no-compute]

``RUN`` is a stacking run logged by :func:`src.mlops.tracking.log_analysis`: either one dataset's child run, or the
analysis' parent run with ``--dataset`` (not needed when it has a single dataset). The stacker is registered
and given the alias only when both hold on that dataset:

* the panel is **admissible** (enough competent members, decorrelated errors: the §3.3 rule read off the
  calibration set) — outside that region the paper's own finding is that aggregation need not pay; and
* its paired Δκ against the **CV-best single judge** is a **win** (95 % paired cluster-bootstrap lower bound
  above 0; "clean win" also clears the oracle) — otherwise deploying the best single judge is as good and
  simpler.

and, where the run carries RAIM's deployment decision (:mod:`src.core.decide`, tag ``decision``), that decision is
to deploy the panel (its stacked κ also reaches ``analysis.kappa_floor``).

It also refuses a model that cannot serve: one that fails to load, whose signature does not name its input
example's columns, or that cannot predict that example (:func:`src.mlops.serving.self_check`).

Otherwise it refuses, says why, and exits with status 2. Any other error (an unknown run id, a registered model
that does not exist) is one line on stderr and exit status 2 as well (``RAIM_DEBUG=1`` shows the traceback). After a promotion
``mlflow.pyfunc.load_model("models:/<name>@<alias>")`` loads the stacker (:class:`src.mlops.serving.StackerModel`).

``log-panel`` logs, in a new ``kind=panel`` run, a :class:`src.mlops.serving.PanelModel`: the roster's judges (through the
verdict cache) and a logged stacker (``--stacker-uri``, e.g. ``models:/raim-stacker-wice@champion``);
``python -m src.serve model --model-uri <its uri>`` serves it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from hydra import compose, initialize_config_dir

from src.core.decide import WINS
from src.core.errors import ArgumentParser, RaimError, one_line
from src.io.paths import CONF_DIR
from src.mlops import store
from src.mlops import tracking as track
from src.mlops.serving import log_panel, self_check
from src.mlops.store import quiet_mlflow, tracking_uri

REFUSED = 2


class PromotionRefused(RaimError, RuntimeError):
    """The run's stacker does not qualify; the message says why."""


@dataclass
class Candidate:
    run_id: str
    dataset: str
    model_uri: str
    tags: dict
    metrics: dict


def _fmt(metrics: dict, key: str) -> str:
    est, lo, hi = (metrics.get(f"{key}{s}") for s in ("", "_lo", "_hi"))
    if est is None:
        return "n/a"
    ci = f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None and hi is not None else ""
    return f"{est:+.3f}{ci}"


def reasons_to_refuse(tags: dict, metrics: dict) -> list[str]:
    """Why this dataset run's stacker must not be promoted (empty: it qualifies)."""
    why = []
    if tags.get("admissible") != "true":
        why.append(f"the panel is not admissible ({tags.get('admissibility_reason', 'no admissibility recorded')})")
    call = tags.get("call.best_cv.kappa")
    if call not in WINS:
        why.append(f"the stacker's paired Δκ vs the CV-best single is {_fmt(metrics, 'delta_best_cv/kappa')}: "
                   f"a {call or 'missing call'}, not a win (needs the 95% lower bound above 0)")
    if not why and tags.get("decision", "panel") != "panel":
        why.append(f"RAIM's decision on this dataset is not to deploy the panel ({tags.get('decision_reason', '')})")
    return why


def find_candidate(run_id: str, dataset: str | None = None) -> Candidate:
    """The dataset run holding the stacker model: ``run_id`` itself, or its child for ``dataset``."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    run = mlflow.get_run(run_id)
    if "stacker_model_uri" not in run.data.tags:
        kids = mlflow.search_runs([run.info.experiment_id], output_format="list",
                                  filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
        kids = [k for k in kids if "stacker_model_uri" in k.data.tags]
        names = sorted(k.data.tags.get("dataset", "?") for k in kids)
        if dataset:
            kids = [k for k in kids if k.data.tags.get("dataset") == dataset]
        if len(kids) != 1:
            what = f"no dataset run {dataset!r}" if dataset else "several dataset runs"
            raise PromotionRefused(f"run {run_id} has {what} with a stacker (datasets: {names or 'none'}); "
                                   f"pass --dataset NAME or a dataset run's id")
        run = kids[0]
    elif dataset and run.data.tags.get("dataset") != dataset:
        raise PromotionRefused(f"run {run_id} is dataset {run.data.tags.get('dataset')!r}, not {dataset!r}")
    return Candidate(run.info.run_id, run.data.tags.get("dataset", "all"), run.data.tags["stacker_model_uri"],
                     dict(run.data.tags), dict(run.data.metrics))


def promote(run_id: str, dataset: str | None = None, name: str | None = None, alias: str = "champion"):
    """Register the stacker of ``run_id`` (its ``dataset`` child) as ``name`` and point ``alias`` at it.

    Raises :class:`PromotionRefused` when the run does not qualify. Returns the ``ModelVersion``.
    """
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    cand = find_candidate(run_id, dataset)
    why = reasons_to_refuse(cand.tags, cand.metrics)
    broken = self_check(cand.model_uri)
    if broken:
        why.append(f"its logged stacker {cand.model_uri} cannot serve: {broken}")
    if why:
        raise PromotionRefused(f"refusing to promote the stacker of run {cand.run_id} (dataset {cand.dataset}): "
                               + "; and ".join(why))
    name = name or f"raim-stacker-{cand.dataset}"
    mv = mlflow.register_model(cand.model_uri, name, tags={
        "run_id": cand.run_id, "dataset": cand.dataset, "roster": cand.tags.get("roster", ""),
        "admissible": "true", "call.best_cv.kappa": cand.tags["call.best_cv.kappa"],
        "delta_best_cv_kappa": _fmt(cand.metrics, "delta_best_cv/kappa")})
    client = MlflowClient()
    client.set_registered_model_alias(name, alias, mv.version)
    client.update_model_version(name, mv.version, description=(
        f"RAIM stacker for {cand.dataset} (roster {cand.tags.get('roster', '?')}), run {cand.run_id}: admissible "
        f"({cand.tags.get('admissibility_reason', '')}); Δκ vs CV-best {_fmt(cand.metrics, 'delta_best_cv/kappa')} "
        f"({cand.tags['call.best_cv.kappa']})."))
    return mv


def log_panel_run(roster: str, stacker_uri: str, default_frame: str = "claim", cache_dir: str | None = None,
                  compute: bool = True) -> tuple[str, str]:
    """A panel model (roster ``roster`` + the stacker at ``stacker_uri``) logged in a new ``kind=panel`` run;
    returns (its model URI, the run id)."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    if not (CONF_DIR / "roster" / f"{roster}.yaml").exists():
        raise RaimError(f"no roster {roster!r} under conf/roster")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[f"roster={roster}"])
    store.setup(cfg)
    inner = mlflow.pyfunc.load_model(stacker_uri).unwrap_python_model()
    if type(inner).__name__ != "StackerModel":
        raise RaimError(f"{stacker_uri} is not a RAIM stacker model ({type(inner).__name__})")
    with track.start_run(cfg, "panel", tags={"stacker_uri": stacker_uri}) as run:
        info = log_panel(cfg.roster, inner.stacker, inner.columns, default_frame, cache_dir, compute)
        mlflow.set_tag("panel_model_uri", info.model_uri)
    return info.model_uri, run.info.run_id


@one_line
def main(argv: list[str] | None = None) -> int:

    ap = ArgumentParser(prog="python -m src.registry", description=__doc__.splitlines()[0])
    ap.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or the repo's mlflow.db")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("promote", help="register a run's stacker and alias it, if admissible and a win (the panel decision)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--dataset", default=None, help="which dataset child of an analysis run")
    p.add_argument("--name", default=None, help="registered model name (default raim-stacker-<dataset>)")
    p.add_argument("--alias", default="champion")
    s = sub.add_parser("show", help="versions and aliases of a registered model")
    s.add_argument("--name", required=True)
    lp = sub.add_parser("log-panel", help="roster + a logged stacker -> a panel model in a new run")
    lp.add_argument("--roster", required=True)
    lp.add_argument("--stacker-uri", required=True, help="a stacker model URI (models:/…, runs:/…)")
    lp.add_argument("--default-frame", default="claim")
    lp.add_argument("--cache-dir", default=None)
    lp.add_argument("--no-compute", action="store_true", help="never score a cache miss (it abstains)")
    a = ap.parse_args(argv)

    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if a.tracking_uri:  # wins everywhere below, log-panel's run included (src.mlops.tracking.tracking_uri reads it first)
        os.environ["MLFLOW_TRACKING_URI"] = a.tracking_uri
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        with quiet_mlflow():
            return {"promote": _promote, "show": _show, "log-panel": _log_panel}[a.cmd](a)
    except MlflowException as e:
        raise RaimError(f"{a.cmd}: {e.message} (tracking store {uri})") from e


def _promote(a) -> int:
    try:
        mv = promote(a.run_id, a.dataset, a.name, a.alias)
    except PromotionRefused as e:
        print(f"REFUSED: {e}", file=sys.stderr)
        return REFUSED
    print(f"promoted: {mv.name} version {mv.version} from run {mv.tags.get('run_id', a.run_id)}; "
          f"load it with mlflow.pyfunc.load_model('models:/{mv.name}@{a.alias}')")
    return 0


def _log_panel(a) -> int:
    uri, run_id = log_panel_run(a.roster, a.stacker_uri, a.default_frame, a.cache_dir, not a.no_compute)
    print(f"panel model {uri} (run {run_id})")
    return 0


def _show(a) -> int:
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    name = a.name
    client = MlflowClient()
    model = client.get_registered_model(name)
    for v in client.search_model_versions(f"name = '{name}'"):
        aliases = [al for al, ver in model.aliases.items() if str(ver) == str(v.version)]
        print(f"{name} v{v.version} run={v.run_id} aliases={aliases} {v.tags.get('delta_best_cv_kappa', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
