"""Registry and panel models for RAIM's stackers: promote only where the panel pays (§2, §3.3); log-panel.

A run's calibrated stacker goes to the MLflow model registry only when RAIM's decision is to deploy the panel;
``log-panel`` wraps a logged stacker with its roster's judges as a panel model.

    python -m src.registry promote --run-id RUN [--dataset NAME] [--name NAME] [--alias champion]
    python -m src.registry show --name NAME
    python -m src.registry log-panel --roster NAME --stacker-uri URI [--default-frame claim] [--no-compute]
        [--injection-defence escalate|immune|off]

``RUN`` is a stacking run logged by :func:`src.mlops.tracking.log_analysis`: either one dataset's child run, or the
analysis' parent run with ``--dataset`` (not needed when it has a single dataset). The stacker is registered
and given the alias only when both hold on that dataset:

* the panel is **admissible** (enough competent members, decorrelated errors: the §3.3 rule read off the
  calibration set) — outside that region the paper's own finding is that aggregation need not pay; and
* its paired Δκ against the **CV-best single judge** is a **win** (95 % paired cluster-bootstrap lower bound
  above 0; "clean win" also clears the oracle) — otherwise deploying the best single judge is as good and
  simpler.

and RAIM's deployment decision (:mod:`src.core.decide`) is to deploy the panel (its stacked κ also reaches
``analysis.kappa_floor``).

None of this is read off the run's tags (anyone who can write to the tracking store can set a tag): the gate
re-derives the three from the artifacts of the analysis (:func:`evidence`, :func:`rederive`) — the dataset's entry
of the analysis run's ``results.json`` (the dataset run's parent, in the same experiment), which must also be the
dataset run's own ``summary.json`` — recomputing the admissibility verdict from the members' κ and φ̄ at the
analysis' operating point, the call from the paired intervals and the decision with :func:`src.core.decide.decide`;
an entry whose recorded verdict, call or decision differs from what its numbers give is refused. The model it
registers must have been logged by that very run (the logged model's source run id) and be the stacker the entry
describes (its members, its coefficients = ``stacker.beta_full``).

Only once that gate holds is the model read, from its document alone (:mod:`src.mlops.artifact`: nothing is
unpickled or imported); it refuses a model whose document does not read or check, or that cannot predict
(:func:`src.mlops.packaging.self_check`). The registered version records the document's sha256
(:data:`src.mlops.artifact.DIGEST_TAG`): ``src.serve`` and ``src.predict`` refuse the version if it changes.

Otherwise it refuses, says why, and exits with status 2. Any other error (an unknown run id, a registered model
that does not exist) is one line on stderr and exit status 2 as well (``RAIM_DEBUG=1`` shows the traceback). After a
promotion ``python -m src.serve model --model-uri models:/<name>@<alias>`` serves the stacker
(:class:`src.mlops.serving.StackerModel`); ``mlflow.pyfunc.load_model`` also loads it, from its pickle.

``log-panel`` logs, in a new ``kind=panel`` run, a :class:`src.mlops.serving.PanelModel`: the roster's judges (through the
verdict cache) and a logged stacker (``--stacker-uri``, e.g. ``models:/raim-stacker-wice@champion``);
``python -m src.serve model --model-uri <its uri>`` serves it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from src.core import admissibility
from src.core.decide import WINS, decide
from src.core.errors import ArgumentParser, RaimError, one_line
from src.core.evaluate import Delta, best_single_call
from src.core.evidence import comparison
from src.core.injection import DEFAULT_DEFENCE, DEFENCES
from src.io.config import thaw
from src.io.files import DECIMALS, SIGNIFICANT_DIGITS
from src.io.paths import CONF_DIR
from src.io.trust import check_sources
from src.mlops import artifact, store
from src.mlops import tracking as track
from src.mlops.packaging import load_model, log_panel, self_check
from src.mlops.serving import StackerModel
from src.mlops.store import quiet_mlflow, tracking_uri
from src.studies.checked import check_config

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
    experiment_id: str = ""


def _delta(d: dict) -> Delta:
    return Delta(d["estimate"], list(d["ci"]), d.get("p_one_sided"), d.get("call"))


def rederive(s: dict, settings: dict) -> dict:
    """Admissibility (§3.3), the call against the CV-best single (§2) and the decision (:mod:`src.core.decide`)
    recomputed from one dataset's results.json entry ``s`` and the analysis ``settings``: the verdict from its
    coordinates (the members' κ, φ̄) at the analysis' operating point (κ₀, c, φ₀), the call from the paired
    intervals (:func:`src.core.evaluate.best_single_call`) against the CV-best single as deployed (the comparison
    the decision reads, :func:`src.core.evidence.comparison`; §2's in an older entry),
    the decision by :func:`src.core.decide.decide` at the analysis' κ floor. The verdict, call and decision the
    entry records are not read."""
    a = s["admissibility"]
    point = {k: float(settings.get(k, a[k])) for k in ("kappa0", "c", "phi0")}
    member_k = np.array([float(v["kappa"]) for v in s["members"].values()], dtype=float)
    admissible, reason = admissibility.decide(member_k, a["phi_bar"], point["kappa0"], point["c"], point["phi0"])
    key = comparison(s)
    oracle = s["deltas"].get("oracle", {}).get("kappa")
    call = best_single_call(_delta(s["deltas"][key]["kappa"]), _delta(oracle) if oracle else None)
    best_cv = s["deltas"][key]
    recomputed = {
        **s,
        "admissibility": {
            **a,
            **point,
            "admissible": admissible,
            "reason": reason,
            "members_at_kappa0": int(np.sum(admissibility.reaches(member_k, point["kappa0"]))),
            "n_members": len(member_k),
        },
        "deltas": {**s["deltas"], key: {**best_cv, "kappa": {**best_cv["kappa"], "call": call}}},
    }
    return {
        "admissible": admissible,
        "admissibility_reason": reason,
        "call": call,
        "decision": decide(recomputed, float(settings.get("kappa_floor", 0.40))),
    }


def reasons_to_refuse(s: dict, settings: dict) -> list[str]:
    """Why this dataset's stacker must not be promoted (empty: it qualifies), from its results.json entry ``s``
    re-derived (:func:`rederive`): the panel must be admissible, a win against the CV-best single, and RAIM's
    decision must be to deploy it; an entry whose recorded admissibility, call or decision differs from what its
    own numbers give is refused too."""
    r = rederive(s, settings)
    why = []
    if not r["admissible"]:
        why.append(f"the panel is not admissible ({r['admissibility_reason']})")
    if r["call"] not in WINS:
        d = s["deltas"][comparison(s)]["kappa"]
        why.append(
            f"the stacker's paired Δκ vs the CV-best single is {d['estimate']:+.3f} "
            f"[{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]: a {r['call']}, not a win (needs the 95% lower bound "
            f"above 0)"
        )
    if not why and r["decision"].action != "panel":
        why.append(f"RAIM's decision on this dataset is not to deploy the panel ({r['decision'].reason})")
    recorded = {
        "admissibility": (bool(s["admissibility"].get("admissible")), r["admissible"]),
        "call vs the CV-best single": (s["deltas"][comparison(s)]["kappa"].get("call"), r["call"]),
        "decision": ((s.get("decision") or {}).get("action"), r["decision"].action),
    }
    why += [
        f"its results.json records the {what} {was!r} where its own numbers give {now!r}"
        for what, (was, now) in recorded.items()
        if was != now
    ]
    return why


def _json_artifact(run_id: str, name: str) -> dict | None:
    """A run's JSON artifact, or None when it has none (or it is not a JSON object)."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name, dst_path=tmp)
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (MlflowException, OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def evidence(cand: Candidate) -> tuple[dict, dict]:
    """The dataset's entry of its analysis' ``results.json`` and the analysis settings, as RAIM logs them
    (:func:`src.mlops.tracking.log_analysis`): the dataset run's parent, in the same experiment, holds
    ``results.json``, and the dataset run's own ``summary.json`` is that entry."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    where = f"the stacker of run {cand.run_id} (dataset {cand.dataset})"
    parent_id = cand.tags.get("mlflow.parentRunId")
    if not parent_id:
        raise PromotionRefused(
            f"refusing to promote {where}: it is not a dataset run of a RAIM analysis (no "
            f"parent run holding results.json)"
        )
    parent = mlflow.get_run(parent_id)
    doc = _json_artifact(parent_id, "results.json") or {}
    datasets = doc.get("datasets") if isinstance(doc.get("datasets"), dict) else {}
    entry = datasets.get(cand.dataset)
    if parent.info.experiment_id != cand.experiment_id or not isinstance(entry, dict):
        raise PromotionRefused(
            f"refusing to promote {where}: its parent run {parent_id} holds no results.json "
            f"entry for {cand.dataset!r} in the run's experiment"
        )
    if _json_artifact(cand.run_id, "summary.json") != entry:
        raise PromotionRefused(
            f"refusing to promote {where}: its summary.json is not the {cand.dataset!r} entry "
            f"of its analysis' results.json (run {parent_id})"
        )
    return entry, doc["settings"] if isinstance(doc.get("settings"), dict) else {}


def model_source_run(model_uri: str) -> str | None:
    """The id of the run that logged the model at ``model_uri`` (``models:/m-…``: a logged model;
    ``runs:/<id>/…``); None for any other URI (a registered version, a path: no run of its own)."""
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    if model_uri.startswith("runs:/"):
        return model_uri[len("runs:/") :].split("/", 1)[0] or None
    if model_uri.startswith("models:/m-") and "/" not in model_uri[len("models:/") :]:
        return MlflowClient().get_logged_model(model_uri[len("models:/") :]).source_run_id
    return None


BETA_RTOL, BETA_ATOL = 10.0 ** (1 - SIGNIFICANT_DIGITS), 10.0**-DECIMALS
"""How far a model's coefficient may lie from the β its results record: those are rounded
(:func:`src.core.aggregate.reported_beta`, 10 decimals) and written as every float of a JSON result
(:func:`src.io.files.written_float`: 7 significant digits, at most the 9th decimal), each at most half a step away."""


def stacker_mismatch(model_uri: str, s: dict) -> str | None:
    """Why the stacker at ``model_uri`` is not the one ``s`` (a results.json entry) describes — its vote
    columns are the entry's members, its coefficients the entry's ``stacker.beta_full`` —; None when it is. The
    model is read from its document (:func:`src.mlops.packaging.load_model`: nothing unpickled)."""
    inner = load_model(model_uri)
    stacker = inner.stacker
    if not isinstance(inner, StackerModel):
        return f"it is not a RAIM stacker model ({type(inner).__name__})"
    members = list(s["members"])
    if list(inner.columns)[: len(members)] != members:
        return f"it votes with {list(inner.columns)}, not with the members {members} of its results"
    fitted = np.array([stacker.intercept_, *np.ravel(stacker.coef_)], dtype=float)
    recorded = np.array(
        [s["stacker"]["beta_full"].get(k, np.nan) for k in ["intercept", *s["stacker"]["features"]]], dtype=float
    )
    if fitted.shape != recorded.shape or not np.allclose(fitted, recorded, rtol=BETA_RTOL, atol=BETA_ATOL):
        return "its coefficients are not the β its results record (stacker.beta_full)"
    return None


def find_candidate(run_id: str, dataset: str | None = None) -> Candidate:
    """The dataset run holding the stacker model: ``run_id`` itself, or its child for ``dataset``."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    run = mlflow.get_run(run_id)
    if "stacker_model_uri" not in run.data.tags:
        kids = mlflow.search_runs(
            [run.info.experiment_id], output_format="list", filter_string=f"tags.mlflow.parentRunId = '{run_id}'"
        )
        kids = [k for k in kids if "stacker_model_uri" in k.data.tags]
        names = sorted(k.data.tags.get("dataset", "?") for k in kids)
        if dataset:
            kids = [k for k in kids if k.data.tags.get("dataset") == dataset]
        if len(kids) != 1:
            what = f"no dataset run {dataset!r}" if dataset else "several dataset runs"
            raise PromotionRefused(
                f"run {run_id} has {what} with a stacker (datasets: {names or 'none'}); "
                f"pass --dataset NAME or a dataset run's id"
            )
        run = kids[0]
    elif dataset and run.data.tags.get("dataset") != dataset:
        raise PromotionRefused(f"run {run_id} is dataset {run.data.tags.get('dataset')!r}, not {dataset!r}")
    return Candidate(
        run.info.run_id,
        run.data.tags.get("dataset", "all"),
        run.data.tags["stacker_model_uri"],
        dict(run.data.tags),
        dict(run.data.metrics),
        run.info.experiment_id,
    )


def fitted_on(tags: dict) -> str:
    """What a run's stacker was fitted on, for its registry description: ``roster cpu``, or a bring-your-own verdict
    table by its file name (no roster judged it: ``verdicts simulated-panel.csv``)."""
    if tags.get("roster"):
        return f"roster {tags['roster']}"
    if tags.get("verdicts"):
        return f"verdicts {Path(tags['verdicts']).name}"
    return "no roster recorded"


def promote(run_id: str, dataset: str | None = None, name: str | None = None, alias: str = "champion"):
    """Register the stacker of ``run_id`` (its ``dataset`` child) as ``name`` and point ``alias`` at it.

    Raises :class:`PromotionRefused` when the run does not qualify. Returns the ``ModelVersion``.
    """
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    cand = find_candidate(run_id, dataset)
    s, settings = evidence(cand)
    where = f"the stacker of run {cand.run_id} (dataset {cand.dataset})"
    source = model_source_run(cand.model_uri)
    if source != cand.run_id:
        raise PromotionRefused(
            f"refusing to promote {where}: its model {cand.model_uri} was logged by "
            f"{'run ' + source if source else 'no run'}, not by this run"
        )
    why = reasons_to_refuse(s, settings)  # from the run's data: no model is read before the gate holds
    if why:
        raise PromotionRefused(f"refusing to promote {where}: " + "; and ".join(why))
    broken = self_check(cand.model_uri)
    other = None if broken else stacker_mismatch(cand.model_uri, s)
    if broken:
        why.append(f"its logged stacker {cand.model_uri} cannot serve: {broken}")
    if other:
        why.append(f"its logged stacker {cand.model_uri} is not the stacker its results describe: {other}")
    if why:
        raise PromotionRefused(f"refusing to promote {where}: " + "; and ".join(why))
    _, _, digest = artifact.read(cand.model_uri)
    r, d = rederive(s, settings), s["deltas"][comparison(s)]["kappa"]
    delta = f"{d['estimate']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
    name = name or f"raim-stacker-{cand.dataset}"
    mv = mlflow.register_model(
        cand.model_uri,
        name,
        tags={
            "run_id": cand.run_id,
            "dataset": cand.dataset,
            "roster": cand.tags.get("roster", ""),
            "verdicts": Path(cand.tags["verdicts"]).name if cand.tags.get("verdicts") else "",
            "admissible": "true",
            "call.best_cv.kappa": r["call"],
            "delta_best_cv_kappa": delta,
            artifact.DIGEST_TAG: digest,  # serve and predict refuse the version if its document changes
        },
    )
    client = MlflowClient()
    client.set_registered_model_alias(name, alias, mv.version)
    client.update_model_version(
        name,
        mv.version,
        description=(
            f"RAIM stacker for {cand.dataset} ({fitted_on(cand.tags)}), run {cand.run_id}: admissible "
            f"({r['admissibility_reason']}); Δκ vs CV-best {delta} ({r['call']}); {r['decision'].label}."
        ),
    )
    return mv


def log_panel_run(
    roster: str,
    stacker_uri: str,
    default_frame: str = "claim",
    cache_dir: str | None = None,
    compute: bool = True,
    injection_defence: str = DEFAULT_DEFENCE,
) -> tuple[str, str]:
    """A panel model (roster ``roster`` + the stacker at ``stacker_uri``) logged in a new ``kind=panel`` run;
    returns (its model URI, the run id). ``injection_defence``: what the panel does with an item flagged as a
    prompt injection (:data:`src.core.injection.DEFENCES`)."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    check_sources([f"roster={roster}"])  # every file composed below, checked as data first
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[f"roster={roster}"])
    settings = check_config(cfg)
    store.setup(settings.tracking)
    inner = load_model(stacker_uri)  # its document: nothing unpickled
    if not isinstance(inner, StackerModel):
        raise RaimError(f"{stacker_uri} is not a RAIM stacker model ({type(inner).__name__})")
    with track.start_run(settings, "panel", tags={"stacker_uri": stacker_uri}) as run:
        info = log_panel(
            settings.node("roster"),
            inner.stacker,
            inner.columns,
            default_frame,
            cache_dir,
            compute,
            decision=getattr(inner, "decision", None),
            injection_defence=injection_defence,
            raw_roster=thaw(settings.unresolved["roster"]),
        )
        mlflow.set_tag("panel_model_uri", info.model_uri)
    return info.model_uri, run.info.run_id


@one_line
def main(argv: list[str] | None = None) -> int:

    ap = ArgumentParser(prog="python -m src.registry", description=__doc__.splitlines()[0])
    ap.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or the repo's mlflow.db")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser(
        "promote", help="register a run's stacker and alias it, if admissible and a win (the panel decision)"
    )
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
    lp.add_argument(
        "--injection-defence",
        choices=DEFENCES,
        default=DEFAULT_DEFENCE,
        help="an item flagged as a prompt injection: escalate (no verdict; the default), immune (decided by the "
        "non-LLM members), off (decided as any item)",
    )
    a = ap.parse_args(argv)

    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if (
        a.tracking_uri
    ):  # wins everywhere below, log-panel's run included (src.mlops.tracking.tracking_uri reads it first)
        os.environ["MLFLOW_TRACKING_URI"] = a.tracking_uri
    uri = tracking_uri()
    store.check_server(uri)
    mlflow.set_tracking_uri(uri)
    try:
        with quiet_mlflow():
            return {"promote": _promote, "show": _show, "log-panel": _log_panel}[a.cmd](a)
    except MlflowException as e:
        raise RaimError(f"{a.cmd}: {store.store_failure(e)} (tracking store {uri})") from e
    except Exception as e:
        why = store.store_failure(e)  # a corrupt or read-only sqlite store (SQLAlchemy's error)
        if why is None:
            raise
        raise RaimError(f"{a.cmd}: {why} (tracking store {uri})") from e


def _promote(a) -> int:
    try:
        mv = promote(a.run_id, a.dataset, a.name, a.alias)
    except PromotionRefused as e:
        print(f"error: {e}", file=sys.stderr)  # one line, like every other refusal
        return REFUSED
    print(
        f"promoted: {mv.name} version {mv.version} from run {mv.tags.get('run_id', a.run_id)}; serve it with "
        f"python -m src.serve model --model-uri 'models:/{mv.name}@{a.alias}' (its document, digest-checked)"
    )
    return 0


def _log_panel(a) -> int:
    uri, run_id = log_panel_run(
        a.roster, a.stacker_uri, a.default_frame, a.cache_dir, not a.no_compute, a.injection_defence
    )
    print(f"panel model {uri} (run {run_id})")
    return 0


def name_filter(name: str) -> str | None:
    """An MLflow filter string matching registered model ``name`` exactly, quoted with the quote the name lacks
    (MLflow's filter grammar has no escape); None when the name holds both quotes."""
    for q in ("'", '"'):
        if q not in name:
            return f"name = {q}{name}{q}"
    return None


def model_versions(client, name: str) -> list:
    """Every version of registered model ``name`` (oldest first), whatever characters the name holds."""
    flt = name_filter(name)
    found, token = [], None
    while True:
        page = (
            client.search_model_versions(flt, max_results=1000, page_token=token)
            if flt is not None
            else client.search_model_versions(max_results=1000, page_token=token)
        )
        found += [v for v in page if v.name == name]
        token = getattr(page, "token", None)
        if not token:
            return sorted(found, key=lambda v: int(v.version))


def _show(a) -> int:
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    name = a.name
    client = MlflowClient()
    model = client.get_registered_model(name)
    versions = model_versions(client, name)
    if not versions:
        raise RaimError(
            f"registered model {name!r} has no versions (a version is added by `python -m src.registry "
            f"promote --run-id RUN`)"
        )
    for v in versions:
        aliases = [al for al, ver in model.aliases.items() if str(ver) == str(v.version)]
        print(f"{name} v{v.version} run={v.run_id} aliases={aliases} {v.tags.get('delta_best_cv_kappa', '')}")
        print(f"  input columns: {input_columns(f'models:/{name}/{v.version}')}")
    return 0


def input_columns(model_uri: str) -> str:
    """What a served request must hold, read off the model's signature: a stacker's member columns (one vote
    each: 1, 0, or 0.5 / null = abstained), a panel model's item columns (optional ones marked ``?``)."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    try:
        sig = mlflow.models.get_model_info(model_uri).signature
    except Exception as e:  # noqa: BLE001 - a version whose model cannot be read still lists
        return f"unknown (its model cannot be read: {type(e).__name__})"
    if sig is None or sig.inputs is None:
        return "unknown (no signature)"
    return ", ".join(c.name + ("" if getattr(c, "required", True) else "?") for c in sig.inputs.inputs)


if __name__ == "__main__":
    sys.exit(main())
