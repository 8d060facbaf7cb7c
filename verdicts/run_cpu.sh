#!/usr/bin/env bash
# The committed `cpu` verdicts: every member of conf/roster/cpu.yaml over MedHallu, WiCE, TruthfulQA and
# ExpertQA, 200 items per dataset (whole clusters, stratified by gold, seed 0).  Member by member, cheapest
# first, so each finished member covers all four datasets.  Resumable: kill it at any time and rerun; cached
# verdicts are never recomputed.  Run in the background at low priority:
#   nice -n 19 bash verdicts/run_cpu.sh > /tmp/raim_cpu_run.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # llama.cpp's OpenMP threads spin otherwise (shared cores)
ITEMS=${ITEMS:-datasets}
PER=${PER:-200}
THREADS=${THREADS:-2}
MEMBERS=${MEMBERS:-"lexical minilm smollm135m gemma270m qwen05b qwen15b"}
DATASETS=${DATASETS:-"truthfulqa expertqa medhallu wice"}
PY=${PY:-.venv/bin/python}
for m in $MEMBERS; do
  echo "== $(date +%T) member $m"
  $PY -m src.judges --roster cpu --members "$m" --datasets $DATASETS --items-dir "$ITEMS" \
      --per-dataset "$PER" --compute --threads "$THREADS" --no-progress || echo "member $m failed: $?"
done
# final pass: tables + coverage audit from the cache only
$PY -m src.judges --roster cpu --datasets $DATASETS --items-dir "$ITEMS" --per-dataset "$PER"
echo "== $(date +%T) done"
