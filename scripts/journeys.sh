#!/usr/bin/env bash
# The seven journeys of a newcomer, from a fresh clone (no sibling folder, a new .venv), each step timed:
#   bash scripts/journeys.sh SOURCE WORKDIR    # SOURCE: what to `git clone` (a forge URL, or this checkout)
# 1 install and the main job (its summary against the README's), 2 the fast tests, 3 the docs site, 4 the MLflow UI
# (the @champion alias over its REST API), 5 promote -> serve -> score (against docs/deploy.md), 6 a 60-record
# benchmark of one's own through one YAML file (docs/own-benchmark.md, roster tiny), 7 propose -> label ->
# estimate with src.rate, then `dvc repro` twice in a clone whose dvc.lock is up to date. WORKDIR/times.txt holds
# the times (docs/getting-started.md quotes them), WORKDIR/<step>.log each step's output. Run it on a quiet
# machine: it takes ~25 minutes on two cores, most of them judging (6) and the tests (2).
set -uo pipefail
SRC=${1:?usage: bash scripts/journeys.sh SOURCE WORKDIR}
J=$(mkdir -p "${2:?usage: bash scripts/journeys.sh SOURCE WORKDIR}" && cd "$2" && pwd); R=$J/raim
rm -rf "$R" "$J/fresh" "$J"/site "$J"/*.log "$J"/times.txt
t() { local name=$1; shift; local s e; s=$(date +%s.%N); "$@" > "$J/$name.log" 2>&1; local rc=$?; e=$(date +%s.%N);
      printf "%-22s rc=%d %7.1f s\n" "$name" "$rc" "$(echo "$e - $s" | bc)" | tee -a "$J/times.txt"; return $rc; }
git clone -q "$SRC" "$R"
cd "$R" && git log --oneline -1 | tee -a "$J/times.txt"
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1
# 1. install and the main job
t 1-setup bash scripts/setup.sh
source .venv/bin/activate
t 1-main-job python -m src.run
sed -n '/^RAIM summary/,/^expertqa/p' "$J/1-main-job.log" > "$J/summary.txt"
sed -n '/^RAIM summary/,/^expertqa/p' README.md | diff - "$J/summary.txt" > "$J/summary.diff" && echo "summary = README: yes" | tee -a "$J/times.txt" || echo "summary = README: NO" | tee -a "$J/times.txt"
# 2. the fast tests
t 2-fast-tests python -m pytest -m "not slow" -p no:cacheprovider
tail -3 "$J/2-fast-tests.log" | tee -a "$J/times.txt"
# 3. the docs site
t 3-docs-install pip install -q -e '.[docs]'
t 3-docs-build env NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true python -m mkdocs build --strict --site-dir "$J/site"
echo "site pages: $(find "$J/site" -name index.html | wc -l); reference/SUMMARY: $(test -e "$J/site/reference/SUMMARY" && echo present || echo absent)" | tee -a "$J/times.txt"
# 4-5. promote -> serve -> score (docs/deploy.md), then the MLflow UI with @champion
t 5-analyse python -m src.run verdicts=examples/simulated-panel.csv
RUN=$(grep -o "^MLflow run [0-9a-f]*" "$J/5-analyse.log" | awk '{print $3}')
t 5-promote python -m src.registry promote --run-id "$RUN" --dataset simulated
s=$(date +%s.%N)
python -m src.serve model --model-uri "models:/raim-stacker-simulated@champion" --port 5071 > "$J/5-serve.log" 2>&1 & SERVE=$!
until grep -q "^ready on" "$J/5-serve.log" || ! kill -0 $SERVE 2>/dev/null; do sleep 0.5; done
printf "%-22s %7.1f s\n" "5-serve-ready" "$(echo "$(date +%s.%N) - $s" | bc)" | tee -a "$J/times.txt"
curl -s 127.0.0.1:5071/invocations -H 'Content-Type: application/json' -d '{"dataframe_records": [
  {"m00": 1, "m01": 1, "m02": 0, "m03": 1, "m04": null, "m05": 1, "m06": 1, "m07": 0},
  {"m00": 0, "m01": 0, "m02": 0, "m03": 1, "m04": 0, "m05": 0, "m06": 0, "m07": 0}]}' > "$J/5-score.json"
grep -q '{"predictions": \[{"p_hallucinated": 0.9168301119928884, "verdict": 1, "label": "hallucinated"}, {"p_hallucinated": 0.008907058633154148, "verdict": 0, "label": "supported"}\]}' "$J/5-score.json" && echo "score = docs/deploy.md: yes" | tee -a "$J/times.txt" || { echo "score = docs/deploy.md: NO"; cat "$J/5-score.json"; } | tee -a "$J/times.txt"
kill $SERVE; wait $SERVE 2>/dev/null
s=$(date +%s.%N)
mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5072 --workers 1 > "$J/4-ui.log" 2>&1 & UI=$!
until curl -sf "127.0.0.1:5072/api/2.0/mlflow/registered-models/alias?name=raim-stacker-simulated&alias=champion" > "$J/4-champion.json" || ! kill -0 $UI 2>/dev/null; do sleep 1; done
printf "%-22s %7.1f s\n" "4-ui-champion" "$(echo "$(date +%s.%N) - $s" | bc)" | tee -a "$J/times.txt"
grep -o '"aliases": \[[^]]*\]' "$J/4-champion.json" | tee -a "$J/times.txt"
kill $UI; wait $UI 2>/dev/null
# 6. a 60-record benchmark of one's own through one YAML file (docs/own-benchmark.md, roster tiny)
mkdir -p data/own/newbench
python - <<'PY'
import json
recs = [json.loads(l) for l in open("datasets/medhallu.jsonl")][:60]
out = [{"uid": f"r{i}", "source_doc": str(r["cluster_id"]), "query": r["question"], "context": r["evidence"],
        "answer": r["candidate"], "is_hallucination": "yes" if r["gold"] else "no"} for i, r in enumerate(recs)]
json.dump({"data": out}, open("data/own/newbench/qa.json", "w"))
PY
sed -n '/^    ```yaml/,/^    ```$/p' docs/own-benchmark.md | sed '1d;$d' | sed 's/^    //' > conf/dataset/newbench.yaml
t 6-build python -m src.data --datasets newbench --out-dir datasets
t 6-judge python -m src.judges --roster tiny --datasets newbench --per-dataset 200 --compute
t 6-analyse python -m src.run dataset=newbench roster=tiny tracking.enabled=false
grep "^newbench" "$J/6-analyse.log" | tee -a "$J/times.txt"
# 7. propose -> label -> estimate (src.rate) on the newbench items scored by the run's stacker
t 7-run python -m src.run dataset=newbench roster=tiny
RUN7=$(grep -o "^MLflow run [0-9a-f]*" "$J/7-run.log" | awk '{print $3}')
t 7-predict python -m src.predict datasets/newbench.jsonl --run-id "$RUN7" --dataset newbench --roster tiny --cache-dir verdicts/cache --out "$J/scored.jsonl" --no-progress
t 7-propose python -m src.rate propose "$J/scored.jsonl" 20 --proposal "$J/next.json"
python - <<PY
import json, pandas as pd
gold = {str(json.loads(l)["item_id"]): json.loads(l)["gold"] for l in open("datasets/newbench.jsonl")}
t = pd.read_csv("$J/next.labels.csv", dtype={"item_id": str}); t["gold"] = [gold[i] for i in t["item_id"]]
t.to_csv("$J/next.labels.csv", index=False)
PY
t 7-estimate python -m src.rate estimate "$J/scored.jsonl" --labels "$J/next.labels.csv" --proposal "$J/next.json"
cat "$J/7-estimate.log" | tail -8 >> "$J/times.txt"
rm -rf data/own/newbench conf/dataset/newbench.yaml datasets/newbench.jsonl datasets/summary/newbench.json verdicts/cache/newbench verdicts/tables/tiny
git status --porcelain | tee "$J/status-before-repro.txt"
# 8. dvc repro in the clean clone (a dvc.lock older than the code it records runs every stage here: counted, and
# `git status` shows whether any committed output changed), then in a clone of it whose dvc.lock is up to date
# (committed locally): the first and the second run timed
git checkout -q -- . ; git clean -qfd -e .venv -e mlflow.db -e mlruns -e outputs
t 8-dvc-repro-stale dvc repro
grep -c "^Running stage" "$J/8-dvc-repro-stale.log" | sed 's/^/stages run with the stale lock: /' | tee -a "$J/times.txt"
grep -c "is empty" "$J/8-dvc-repro-stale.log" | sed 's/^/"is empty" warnings: /' | tee -a "$J/times.txt"
git status --porcelain | tee -a "$J/times.txt"
git -c user.name=t -c user.email=t@t commit -qm "dvc.lock as dvc repro wrote it" dvc.lock
git clone -q "$R" "$J/fresh" && cd "$J/fresh"
t 8-dvc-repro-1 dvc repro
grep "^Running stage" "$J/8-dvc-repro-1.log" | tee -a "$J/times.txt"
t 8-dvc-repro-2 dvc repro
grep -c "^Running stage" "$J/8-dvc-repro-2.log" | sed 's/^/stages run by the second: /' | tee -a "$J/times.txt"
git status --porcelain | tee -a "$J/times.txt"
echo done | tee -a "$J/times.txt"
