"""The person in the walk-through: labels the traces `src.rate propose --tag-traces` asked for, as a reviewer would in
the MLflow trace view (Add feedback → name `hallucinated`, value true / false), here with the benchmark's own gold.

    python examples/traces/label.py --experiment raim-rag-demo --request label30 [--dataset medhallu]

A real deployment skips this script: the reviewers label in the UI, filtering the traces on
tags.`raim.label_request` = '<the proposal's name>'.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlflow
from mlflow.entities import AssessmentSource

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="raim-rag-demo")
    ap.add_argument("--request", required=True, help="the proposal's name (the tag's value)")
    ap.add_argument("--dataset", default="medhallu")
    ap.add_argument("--reviewer", default="reviewer@example.com")
    a = ap.parse_args()
    gold = {}
    for line in (ROOT / "datasets" / f"{a.dataset}.jsonl").open():
        rec = json.loads(line)
        gold[rec["item_id"]] = int(rec["gold"])
    exp = mlflow.get_experiment_by_name(a.experiment).experiment_id
    asked = mlflow.search_traces(
        locations=[exp], filter_string=f"tags.`raim.label_request` = '{a.request}'", return_type="list"
    )
    who = AssessmentSource(source_type="HUMAN", source_id=a.reviewer)
    for t in asked:
        label = gold[t.info.client_request_id]  # the reviewer reads the answer against the passage
        mlflow.log_feedback(trace_id=t.info.trace_id, name="hallucinated", value=bool(label), source=who)
    print(
        f"{a.reviewer} labelled {len(asked)} trace(s) ({sum(gold[t.info.client_request_id] for t in asked)} hallucinated)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
