#!/usr/bin/env bash
# One command from a fresh clone to trained, evaluated models on CPU:
#   1. set up .venv (torch, requirements, Horovod 0.28.1 built once and cached)
#   2. build the synthetic demo dataset (mp4 clips in LMDB + ClipBERT-format annotations)
#   3. train text-to-video retrieval with `horovodrun -np 2`, 4. evaluate it on the test split
#   5. train + evaluate frame QA the same way, 6. print a results table.
#
#   QUICKSTART_FAST=1   reduced training (CI smoke run; numbers are not meaningful)
#   QUICKSTART_NP=N     processes (default 2)
#   QUICKSTART_OUT=DIR  outputs (default output/quickstart); the demo data goes to data/demo
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
FAST="${QUICKSTART_FAST:-0}"
NP="${QUICKSTART_NP:-2}"
OUT="${QUICKSTART_OUT:-output/quickstart}"
DATA=data/demo  # the demo configs read their annotations and videos from here
T0=$(date +%s)
step() { echo; echo "==> [$(date +%T), +$(( $(date +%s) - T0 ))s] $*"; }

step "1/6 environment (.venv; the first run builds Horovod, ~5 min on 2 cores)"
./run_scripts/setup_env.sh
PY="$REPO/.venv/bin/python"
export PATH="$REPO/.venv/bin:$PATH" PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1

step "2/6 synthetic demo data in $DATA"
if [ -f "$DATA/stats.json" ]; then
  echo "reusing $DATA (delete it to rebuild)"
else
  "$PY" -m src.preprocessing.make_demo_data --output_dir "$DATA"
fi

EXTRA=(--log_interval 10)
if [ "$FAST" = 1 ]; then
  EXTRA+=(--num_train_epochs 1 --data_ratio 0.05)
  echo "QUICKSTART_FAST=1: reduced training (${EXTRA[*]})"
fi
HVD=(horovodrun -np "$NP" -H "localhost:$NP" --gloo)

timed() {  # timed NAME cmd... : run, remember wall seconds in $OUT/NAME.wall
  local name=$1; shift
  local t=$(date +%s)
  "$@"
  echo $(( $(date +%s) - t )) > "$OUT/$name.wall"
}
mkdir -p "$OUT"

for run in demo_ret demo_qa_frameqa; do
  if [ -d "$OUT/$run" ]; then echo "removing previous $OUT/$run"; rm -rf "$OUT/$run"; fi
done

step "3/6 train text-to-video retrieval (horovodrun -np $NP, configs/demo_ret.json)"
timed ret_train "${HVD[@]}" "$PY" src/tasks/run_video_retrieval.py --config configs/demo_ret.json \
  --output_dir "$OUT/demo_ret" "${EXTRA[@]}"

step "4/6 retrieval inference on the test split"
timed ret_infer "${HVD[@]}" "$PY" src/tasks/run_video_retrieval.py --do_inference 1 \
  --output_dir "$OUT/demo_ret" --inference_model_step -1 \
  --inference_txt_db "$DATA/txt/retrieval_test.jsonl" --inference_img_db "$DATA/vis_db"

step "5/6 train + evaluate frame QA (horovodrun -np $NP, configs/demo_qa_frameqa.json)"
timed qa_train "${HVD[@]}" "$PY" src/tasks/run_video_qa.py --config configs/demo_qa_frameqa.json \
  --output_dir "$OUT/demo_qa_frameqa" "${EXTRA[@]}"
timed qa_infer "${HVD[@]}" "$PY" src/tasks/run_video_qa.py --do_inference 1 \
  --output_dir "$OUT/demo_qa_frameqa" --inference_model_step -1 \
  --inference_txt_db "$DATA/txt/frameqa_test.jsonl" --inference_img_db "$DATA/vis_db"

step "6/6 results"
"$PY" -m src.utils.quickstart_report --output_dir "$OUT" --data_dir "$DATA" --total_s $(( $(date +%s) - T0 ))
