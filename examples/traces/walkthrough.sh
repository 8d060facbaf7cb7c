#!/usr/bin/env bash
# RAIM where the traffic is, end to end on a fresh local MLflow store (docs/beyond/traces.md shows every output):
# a tiny traced RAG app → RAIM's assessments on its traces → 30 labels asked for, given, read back → the rate.
#   bash examples/traces/walkthrough.sh [DEMO_DIR]        # ~2 min on two cores; no judge model is loaded
set -euo pipefail
cd "$(dirname "$0")/../.."
DEMO=${1:-/tmp/raim-traces-demo}
rm -rf "$DEMO" && mkdir -p "$DEMO"
export MLFLOW_TRACKING_URI="sqlite:///$DEMO/mlflow.db" RAIM_HYDRA_DIR="$DEMO/hydra"
step() { printf '\n$ %s\n' "$*"; "$@"; }

# 1. A calibrated stacker: the cpu roster on medhallu, from the committed verdict cache (logged with its run).
step python -m src.run dataset=medhallu analysis.n_boot=500
MODEL=$(python -c "import mlflow; r = mlflow.search_runs(experiment_names=['raim'], filter_string=\"tags.dataset = 'medhallu'\", output_format='list')[0]; print(r.data.tags['stacker_model_uri'])")
echo "stacker: $MODEL"
# 2. The application's traffic: 200 requests answered from one retrieved passage, and 3 RAIM cannot judge.
step python examples/traces/rag_app.py --experiment raim-rag-demo
# 3. Traces in, assessments out (the verdicts are the committed cache's: --no-compute loads no judge).
step python -m src.traces judge --experiment raim-rag-demo --model-uri "$MODEL" --dataset medhallu \
  --cache-dir verdicts/cache --no-compute --no-progress --out "$DEMO/scored.jsonl" --report "$DEMO/judge.json"
step python -m src.traces judge --experiment raim-rag-demo --model-uri "$MODEL" --dataset medhallu \
  --cache-dir verdicts/cache --no-compute --no-progress   # again: nothing is added twice
# 4. Ask for 30 labels (active sampling), a person gives them in the trace view, RAIM reads them back.
step python -m src.rate propose traces:raim-rag-demo 30 --proposal "$DEMO/label30.json" --tag-traces
step python examples/traces/label.py --experiment raim-rag-demo --request label30
step python -m src.rate estimate traces:raim-rag-demo --labels traces --proposal "$DEMO/label30.json" \
  --out "$DEMO/rate.json"
step python -m src.traces labels --experiment raim-rag-demo --dataset medhallu --cache-dir verdicts/cache \
  --out "$DEMO/gold.csv" --table "$DEMO/labelled.csv"
step python -m src.run verdicts="$DEMO/labelled.csv" tracking.enabled=false   # the ladder on the traffic's labels
# 5. The same panel inside mlflow.genai.evaluate, on the same traces.
step python - <<PY
import mlflow
from src.mlops.scorers import raim_scorers
exp = mlflow.set_experiment("raim-rag-demo").experiment_id  # evaluate copies another experiment's traces
traces = mlflow.search_traces(locations=[exp], filter_string="tags.app = 'raim-rag-demo'", max_results=20)
result = mlflow.genai.evaluate(data=traces, scorers=raim_scorers("$MODEL", dataset="medhallu",
                                                                 cache_dir="verdicts/cache", compute=False))
print({k: round(float(v), 3) for k, v in result.metrics.items()})
PY
# 6. What a person sees: the trace view with RAIM's assessment (a screenshot).
TRACE=$(python -c "import json; print(json.loads(open('$DEMO/scored.jsonl').readline())['item_id'])")
step python scripts/trace_view.py --experiment raim-rag-demo --trace-id "$TRACE" --out "$DEMO/trace-view.png"
