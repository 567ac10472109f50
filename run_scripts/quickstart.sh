#!/usr/bin/env bash
# One command from a fresh clone to trained, evaluated models on CPU:
#   1. set up .venv (torch, requirements, Horovod 0.28.1 built once and cached)
#   2. build the synthetic demo dataset (mp4 clips in LMDB + ClipBERT-format annotations) and
#      pretrain the demo's tiny grid CNN on it (the demo's stand-in for ClipBERT's pretrained ResNet)
#   3. train text-to-video retrieval with `horovodrun -np 2`, 4. evaluate it on the test split
#      (retrieval, and MSRVTT-MC-style multiple choice with the same model)
#   5. train + evaluate frame QA, 6. train + evaluate action (5-way multiple-choice QA),
#   7. print a results table.
#
#   QUICKSTART_FAST=1   reduced training and evaluation (CI smoke run; numbers are not meaningful)
#   QUICKSTART_NP=N     processes (default 2)
#   QUICKSTART_OUT=DIR  outputs (default output/quickstart); the demo data goes to data/demo
#   QUICKSTART_ARGS="--img_resize uint8"  extra flags for every training and inference command
#   VENV_DIR=DIR        the env (default .venv; /opt/venv in the Docker image), as in setup_env.sh
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
FAST="${QUICKSTART_FAST:-0}"
NP="${QUICKSTART_NP:-2}"
OUT="${QUICKSTART_OUT:-output/quickstart}"
DATA=data/demo  # the demo configs read their annotations and videos from here
T0=$(date +%s)
step() { echo; echo "==> [$(date +%T), +$(( $(date +%s) - T0 ))s] $*"; }

step "1/7 environment (.venv; the first run builds Horovod, ~5 min on 2 cores)"
./run_scripts/setup_env.sh
VENV_DIR="${VENV_DIR:-$REPO/.venv}"
PY="$VENV_DIR/bin/python"
export PATH="$VENV_DIR/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1

step "2/7 synthetic demo data and the pretrained demo CNN in $DATA"
if [ -f "$DATA/stats.json" ]; then
  echo "reusing $DATA (delete it to rebuild)"
else
  "$PY" -m clipbert_legacy.preprocessing.make_demo_data --output_dir "$DATA"
fi
if [ ! -f "$DATA/pretrained/cnn_tiny_grid.pth" ]; then
  "$PY" -m clipbert_legacy.preprocessing.pretrain_demo_cnn --data_dir "$DATA"
fi

read -r -a USER_ARGS <<< "${QUICKSTART_ARGS:-}"
EXTRA=(--log_interval 10 "${USER_ARGS[@]}")
EVAL=("${USER_ARGS[@]}")
if [ "$FAST" = 1 ]; then  # a smoke run: 2% of the training data, validation and tests on their first 16 rows
  EXTRA+=(--num_train_epochs 1 --data_ratio 0.02 --max_eval_examples 16)
  EVAL+=(--max_eval_examples 16)
  echo "QUICKSTART_FAST=1: reduced training and evaluation (${EXTRA[*]})"
fi
# horovodrun, with its rendezvous server and Gloo on 127.0.0.1 only (src/clipbert_legacy/compat/loopback.py)
HVD=("$PY" -m clipbert_legacy.compat.loopback horovodrun -np "$NP" -H "localhost:$NP" --gloo)

timed() {  # timed NAME cmd... : run, remember wall seconds in $OUT/NAME.wall
  local name=$1; shift
  local t=$(date +%s)
  "$@"
  echo $(( $(date +%s) - t )) > "$OUT/$name.wall"
}
mkdir -p "$OUT"

for run in demo_ret demo_qa_frameqa demo_qa_action; do
  if [ -d "$OUT/$run" ]; then echo "removing previous $OUT/$run"; rm -rf "$OUT/$run"; fi
done

infer() {  # infer WALL_NAME SCRIPT RUN TXT_DB: evaluate the last checkpoint of $OUT/RUN on TXT_DB
  timed "$1" "${HVD[@]}" "$PY" "src/tasks/$2" --do_inference 1 --output_dir "$OUT/$3" \
    --inference_model_step -1 --inference_txt_db "$DATA/txt/$4" --inference_img_db "$DATA/vis_db" \
    "${EVAL[@]}"
}
train() {  # train WALL_NAME SCRIPT CONFIG_PATH: train one config into $OUT/<config stem>
  timed "$1" "${HVD[@]}" "$PY" "src/tasks/$2" --config "$3" --output_dir "$OUT/$(basename "$3" .json)" \
    "${EXTRA[@]}"
}

step "3/7 train text-to-video retrieval (horovodrun -np $NP, configs/demo_ret.json)"
train ret_train run_video_retrieval.py configs/demo_ret.json

step "4/7 retrieval and multiple-choice inference on the test split"
infer ret_infer run_video_retrieval.py demo_ret retrieval_test.jsonl
infer mc_infer run_msrvtt_mc.py demo_ret mc_test.jsonl

step "5/7 train + evaluate frame QA (horovodrun -np $NP, configs/demo_qa_frameqa.json)"
train qa_train run_video_qa.py configs/demo_qa_frameqa.json
infer qa_infer run_video_qa.py demo_qa_frameqa frameqa_test.jsonl

step "6/7 train + evaluate action, 5-way multiple-choice QA (horovodrun -np $NP, configs/demo_qa_action.json)"
train action_train run_video_qa.py configs/demo_qa_action.json
infer action_infer run_video_qa.py demo_qa_action action_test.jsonl

step "7/7 results"
"$PY" run_scripts/quickstart_report.py --output_dir "$OUT" --data_dir "$DATA" --total_s $(( $(date +%s) - T0 ))
