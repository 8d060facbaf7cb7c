#!/usr/bin/env bash
# The committed `cpu` verdicts: every member of conf/roster/cpu.yaml over MedHallu, WiCE, TruthfulQA and
# ExpertQA, 200 items per dataset (whole clusters, stratified by gold, seed 0).  The plan runs cheap
# (member, datasets) steps first and WiCE (long documents) after the three short sets, so that a partial run
# leaves as many members as possible on as many datasets as possible.  Resumable: kill it at any time and
# rerun; cached verdicts are never recomputed.  Run in the background at low priority:
#   ITEMS=datasets nohup nice -n 19 bash verdicts/run_cpu.sh >> /tmp/raim_cpu_run.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # llama.cpp's OpenMP threads spin otherwise (shared cores)
ITEMS=${ITEMS:-datasets}
PER=${PER:-200}
THREADS=${THREADS:-2}
ALL="truthfulqa expertqa medhallu wice"
SHORT="truthfulqa,expertqa,medhallu"
PLAN=${PLAN:-"lexical:${ALL// /,} minilm:${ALL// /,} smollm135m:$SHORT qwen05b:medhallu gemma270m:$SHORT qwen05b:$SHORT smollm135m:wice gemma270m:wice qwen05b:wice qwen15b:$SHORT qwen15b:wice"}
PY=${PY:-.venv/bin/python}
for step in $PLAN; do
  m=${step%%:*}
  ds=${step#*:}
  echo "== $(date +%T) member $m on ${ds//,/ }"
  $PY -m src.judges --roster cpu --members "$m" --datasets ${ds//,/ } --items-dir "$ITEMS" \
      --per-dataset "$PER" --compute --threads "$THREADS" --no-progress || echo "step $step failed: $?"
done
# final pass: every table + the coverage audit, from the cache only
$PY -m src.judges --roster cpu --datasets $ALL --items-dir "$ITEMS" --per-dataset "$PER"
echo "== $(date +%T) done"
