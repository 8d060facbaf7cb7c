"""Serving (src/mlops/serving.py): the promoted stacker behind `mlflow models serve`, and the panel model (tiny roster)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from malformed import serving_requests
from test_track import compose_cfg, free_port, log_simulated, post_json, server, tracking_store

from src.core.aggregate import StackedLogit
from src.core.errors import RaimError
from src.mlops import packaging, registry
from src.mlops import serving as serve

MEMBERS = [f"m{j:02d}" for j in range(8)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    with tracking_store(tmp) as uri:
        log_simulated(tmp, which=("good",))
        import mlflow

        run_id = mlflow.search_runs(
            search_all_experiments=True, output_format="list", filter_string="tags.dataset = 'good'"
        )[0].info.run_id
        registry.promote(run_id, alias="champion")
        yield {"uri": uri, "tmp": tmp, "local": mlflow.pyfunc.load_model("models:/raim-stacker-good@champion")}


@pytest.fixture(scope="module")
def served(champion):
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "mlflow",
        "models",
        "serve",
        "-m",
        "models:/raim-stacker-good@champion",
        "--env-manager",
        "local",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-w",
        "1",
    ]
    with server(args, port, "/ping", env={"MLFLOW_TRACKING_URI": champion["uri"]}) as url:
        yield url


@pytest.mark.slow
def test_served_stacker_answers_member_verdicts_with_probability_and_verdict(champion, served):
    rows = [[1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0.5, 1, 1]]
    status, body = post_json(served + "/invocations", {"dataframe_split": {"columns": MEMBERS, "data": rows}})
    assert status == 200, body
    got = pd.DataFrame(body["predictions"])
    expect = champion["local"].predict(pd.DataFrame(rows, columns=MEMBERS))
    assert got["p_hallucinated"].to_numpy() == pytest.approx(expect["p_hallucinated"].to_numpy())
    assert got["verdict"].tolist() == expect["verdict"].tolist() == [1, 0, 1]
    assert got["label"].tolist() == ["hallucinated", "supported", "hallucinated"]
    assert 0.0 <= got["p_hallucinated"].min() and got["p_hallucinated"].max() <= 1.0


@pytest.mark.slow
def test_served_stacker_takes_abstentions_as_null_and_rejects_bad_votes(served):
    rec = {m: 1 for m in MEMBERS}
    abst = {**rec, "m03": None}
    half = {**rec, "m03": 0.5}
    status, body = post_json(served + "/invocations", {"dataframe_records": [abst, half]})
    assert status == 200, body
    a, b = body["predictions"]
    assert a["p_hallucinated"] == pytest.approx(b["p_hallucinated"])
    status, body = post_json(served + "/invocations", {"dataframe_records": [{**rec, "m00": 2}]})
    assert status == 400 and "row 1: column 'm00': 2 is not a vote: 0, 1, or 0.5 / null" in body["message"]
    assert "stack_trace" not in body and "Traceback" not in str(body)
    # MLflow's own server rejects a missing (and so a misspelt) member column through the signature
    status, body = post_json(
        served + "/invocations", {"dataframe_records": [{k: v for k, v in rec.items() if k != "m03"}]}
    )
    assert status == 400 and "m03" in body["message"]


def test_serve_imports_neither_track_nor_registry():
    """One direction only: tracking (src.track) and the registry log models through src.serve, never the reverse."""
    import ast

    tree = ast.parse((ROOT / "src" / "serve.py").read_text())
    imported = {
        (n.module or "") + "." + a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level
        for a in n.names
    }
    assert not {m for m in imported if m.split(".")[0] in ("track", "registry") or m.endswith((".track", ".registry"))}


@pytest.mark.slow
def test_log_panel_command_logs_a_panel_model_of_a_logged_stacker(champion):
    """`python -m src.registry log-panel` (it was `src.serve log-panel`): roster + stacker URI -> a panel run."""
    import subprocess

    import mlflow

    names = [m.name for m in compose_cfg("roster=tiny").roster.members]
    stacker = StackedLogit(n_votes=2).fit(
        np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]] * 3), np.array([0, 1, 0, 1] * 3)
    )
    with tracking_store(champion["tmp"]):
        with mlflow.start_run():
            uri = packaging.log_stacker(stacker, names).model_uri
    env = {**os.environ, "MLFLOW_TRACKING_URI": champion["uri"], "PATH": "/usr/bin:/bin"}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.registry",
            "log-panel",
            "--roster",
            "tiny",
            "--stacker-uri",
            uri,
            "--no-compute",
            "--injection-defence",
            "immune",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0 and p.stdout.startswith("panel model "), p.stderr[-2000:]
    with tracking_store(champion["tmp"]):
        run = mlflow.search_runs(
            search_all_experiments=True, filter_string="tags.kind = 'panel'", output_format="list"
        )[0]
        assert run.data.tags["stacker_uri"] == uri and run.data.tags["roster"] == "tiny"
        inner = mlflow.pyfunc.load_model(run.data.tags["panel_model_uri"]).unwrap_python_model()
        assert type(inner).__name__ == "PanelModel" and inner.columns == names
        # new items' verdicts go to their own cache, never to the committed benchmark cache (a DVC dependency)
        assert inner.config["cache_dir"] == str(serve.SCORED_CACHE.resolve())
        assert inner.config["injection_defence"] == "immune"  # what it does with a flagged item, chosen when logged
        assert packaging.load_model(run.data.tags["panel_model_uri"]).config["injection_defence"] == "immune"
        assert serve.SCORED_CACHE != ROOT / "verdicts" / "cache"


# ------------------------------------------------------------------------------ RAIM's strict server


@pytest.fixture(scope="module")
def strict(champion):
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "src.serve",
        "model",
        "--model-uri",
        "models:/raim-stacker-good@champion",
        "--port",
        str(port),
    ]
    with server(args, port, "/ping", env={"MLFLOW_TRACKING_URI": champion["uri"]}) as url:
        yield url


BAD_REQUESTS = serving_requests(MEMBERS)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_strict_server_rejects_a_malformed_request_with_one_line(strict, case):
    status, body = post_json(strict + "/invocations", BAD_REQUESTS[case])
    assert status == 400, (case, body)
    assert set(body) == {"error_code", "message"} and "\n" not in body["message"], body
    assert "Traceback" not in body["message"] and len(body["message"]) < 400


@pytest.mark.slow
def test_strict_server_answers_valid_requests_like_the_model(champion, strict):
    rows = [[1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0], [1, 0, None, 0, 1, 0.5, 1, 1]]
    status, body = post_json(strict + "/invocations", {"dataframe_split": {"columns": MEMBERS, "data": rows}})
    assert status == 200, body
    expect = champion["local"].predict(pd.DataFrame(rows, columns=MEMBERS, dtype=float))
    got = pd.DataFrame(body["predictions"])
    assert got["p_hallucinated"].to_numpy() == pytest.approx(expect["p_hallucinated"].to_numpy(dtype=float))
    status, recs = post_json(strict + "/invocations", {"dataframe_records": [dict(zip(MEMBERS, r)) for r in rows]})
    assert status == 200 and recs == body
    # every member abstained: no verdict, valid JSON nulls (not NaN), label "abstained"
    status, body = post_json(
        strict + "/invocations", {"dataframe_records": [{m: None for m in MEMBERS}, {m: 0.5 for m in MEMBERS}]}
    )
    assert status == 200, body
    assert [p["label"] for p in body["predictions"]] == ["abstained", "abstained"]
    assert all(p["p_hallucinated"] is None and p["verdict"] is None for p in body["predictions"])


# ------------------------------------------------------------------------------------- panel model

ITEMS = pd.DataFrame(
    {
        "question": ["", "", ""],
        "evidence": [
            "The Eiffel Tower is in Paris and was completed in 1889.",
            "Aspirin reduces fever and mild pain in adults.",
            "The Nile flows north into the Mediterranean Sea.",
        ],
        "candidate": [
            "The Eiffel Tower was completed in 1889 in Paris.",
            "Quantum tunnelling cures diabetes in cats overnight.",
            "The Nile flows north into the Mediterranean.",
        ],
    }
)


def _prefill(roster, model: serve.PanelModel, items: pd.DataFrame, cache_dir, votes: list[int]) -> None:
    """Put verdicts of the LLM member in the cache, as an earlier `python -m src.judges --compute` would."""
    from src.judges.cache import VerdictCache, item_folder
    from src.judges.frames import load_frame
    from src.judges.runner import build_backend

    member = roster["members"][0]
    recs = model.items(items).to_dict("records")
    (folder,) = {item_folder(r) for r in recs}  # served items: the `served` dataset's folder
    cache = VerdictCache(Path(cache_dir) / folder, member["name"], build_backend(member["backend"]).identity())
    frame = load_frame(model.frames[model.default_frame])
    cache.open_for_append()
    for rec, v in zip(recs, votes):
        cache.put(
            {
                "key": cache.key(frame.name, frame.hash, rec),
                "vote": v,
                "logodds": 2.0 * (v - 0.5),
                "mass": 0.9,
                "abstain": None,
                "truncated": False,
                "member": member["name"],
                "item_id": rec["item_id"],
            }
        )


@pytest.fixture(scope="module")
def panel(champion):
    import mlflow
    from omegaconf import OmegaConf

    roster = OmegaConf.to_container(compose_cfg("roster=tiny").roster, resolve=True)
    names = [m["name"] for m in roster["members"]]
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 400)
    X = np.column_stack([np.where(rng.random(400) < 0.8, gold, 1 - gold) for _ in names]).astype(float)
    stacker = StackedLogit(n_votes=len(names)).fit(X, gold)
    with tracking_store(champion["tmp"]):
        with mlflow.start_run():
            info = packaging.log_panel(
                roster, stacker, names, default_frame="claim", cache_dir=champion["tmp"] / "unused-cache"
            )
        yield {"uri": info.model_uri, "roster": roster, "names": names, "stacker": stacker}


def test_panel_model_runs_the_tiny_roster_through_the_cache(panel, tmp_path, monkeypatch):
    import mlflow

    from src.judges.backends import llamacpp

    def no_model(self, *a, **k):
        raise AssertionError("a cached verdict must not load the model")

    monkeypatch.setattr(llamacpp.LlamaCppBackend, "load", no_model)
    cache = tmp_path / "cache"
    model = mlflow.pyfunc.load_model(panel["uri"], model_config={"cache_dir": str(cache)})
    inner = model.unwrap_python_model()
    llm, lexical = panel["names"]
    _prefill(panel["roster"], inner, ITEMS, cache, [0, 1, 0])

    out = model.predict(ITEMS)
    assert list(out.columns) == [
        "item_id",
        llm,
        lexical,
        "p_hallucinated",
        "verdict",
        "label",
        "train_prevalence",
        "uncached",
        "injection_flag",
        "injection_reasons",
        "injection_action",
    ]
    assert out["uncached"].tolist() == ["", "", ""]
    assert out[llm].tolist() == [0, 1, 0]  # from the cache
    assert out[lexical].tolist() == [0, 1, 0]  # computed: supported claims overlap the evidence, the cat cure not
    X = out[[llm, lexical]].to_numpy(dtype=float)
    assert out["p_hallucinated"].to_numpy() == pytest.approx(panel["stacker"].predict_proba(X)[:, 1])
    assert out["verdict"].tolist() == [0, 1, 0]
    assert out["train_prevalence"].tolist() == [panel["stacker"].train_prevalence_] * 3  # what src.rate reads
    assert inner.last_report[lexical]["computed"] == 3 and inner.last_report[llm]["computed"] == 0

    lexical_file = next(cache.glob(f"*/{lexical}/*.jsonl"))
    before = lexical_file.read_bytes()
    again = model.predict(ITEMS)  # the same items again: every verdict is a cache hit
    pd.testing.assert_frame_equal(again, out)
    assert lexical_file.read_bytes() == before and inner.last_report[lexical]["computed"] == 0


def test_panel_model_without_compute_abstains_on_a_miss(panel, tmp_path, monkeypatch):
    import mlflow

    from src.judges.backends import llamacpp

    monkeypatch.setattr(llamacpp.LlamaCppBackend, "load", lambda self: pytest.fail("model loaded"))
    model = mlflow.pyfunc.load_model(panel["uri"], model_config={"cache_dir": str(tmp_path), "compute": False})
    new = pd.DataFrame(
        {"evidence": ["Water boils at 100 C at sea level."], "candidate": ["Water boils at 100 C."], "item_id": ["x1"]}
    )
    _prefill(panel["roster"], model.unwrap_python_model(), new, tmp_path, [1])
    out = model.predict(new)  # the LLM's verdict is cached, the lexical judge's is not (and is not computed)
    assert out["item_id"].tolist() == ["x1"] and out[panel["names"][0]].tolist() == [1]
    assert pd.isna(out[panel["names"][1]][0])
    assert out["uncached"].tolist() == [panel["names"][1]]  # the abstention is a miss, and says so
    assert out["p_hallucinated"][0] == pytest.approx(panel["stacker"].predict_proba([[1.0, 0.5]])[0, 1])


def test_panel_model_refuses_a_stacker_of_another_roster(panel):
    with pytest.raises(RaimError, match=r"votes with member\(s\) \['a', 'b'\] that roster 'tiny' does not have"):
        packaging.log_panel(panel["roster"], panel["stacker"], ["a", "b"])
    model = serve.PanelModel(panel["roster"], {}, "claim", panel["stacker"], panel["names"])
    with pytest.raises(ValueError, match="candidate"):
        model.items(pd.DataFrame({"question": ["q"]}))
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['evidenc'\]"):
        model.items(pd.DataFrame({"candidate": ["c"], "evidenc": ["e"]}))


def test_panel_runs_exactly_the_members_its_stacker_was_fitted_on(panel, champion, tmp_path):
    """A stacker of a dataset where a roster member never voted (e.g. lexical on TruthfulQA) votes with fewer
    columns than the roster has: the panel runs those members only (stop-9 defect: the error named two
    identical lists)."""
    import mlflow

    llm = panel["names"][0]
    one = StackedLogit(n_votes=1).fit(np.array([[0.0], [1.0], [0.0], [1.0]]), np.array([0, 1, 0, 1]))
    with tracking_store(champion["tmp"]):
        with mlflow.start_run():
            info = packaging.log_panel(panel["roster"], one, [llm], cache_dir=tmp_path / "cache")
        model = mlflow.pyfunc.load_model(info.model_uri)
    inner = model.unwrap_python_model()
    assert [m["name"] for m in inner.roster["members"]] == [llm] and inner.columns == [llm]
