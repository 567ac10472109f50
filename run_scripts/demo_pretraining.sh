#!/usr/bin/env bash
# ClipBERT's point in miniature, on CPU: image-text pretraining transfers to video.
#   1. the demo stills (captioned single frames, none of them a frame of a retrieval video)
#   2. pretrain MLM + ITM on them (src/tasks/run_pretrain.py, configs/demo_pretrain.json)
#   3. fine-tune demo retrieval twice with the same budget and a 2-way linear classifier: from that
#      checkpoint (the classifier starts as its ITM head), and from the same starting weights without it
#   4. evaluate both on the retrieval test split and print one table.
# Needs the quickstart's demo data (data/demo); run ./run_scripts/quickstart.sh first.
#
#   DEMO_NP=N           processes (default 2)      DEMO_OUT=DIR  outputs (default output/demo_pretraining)
#   DEMO_PRETRAIN_ARGS="..."  extra flags for the pretraining run (e.g. "--use_mlm 0": ITM only)
#   DEMO_RET_EPOCHS=E   retrieval epochs for both fine-tunings (default 1: a small budget is where
#                       pretraining shows)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
NP="${DEMO_NP:-2}"
OUT="${DEMO_OUT:-output/demo_pretraining}"
EPOCHS="${DEMO_RET_EPOCHS:-1}"
read -r -a PRE_ARGS <<< "${DEMO_PRETRAIN_ARGS:-}"
VENV_DIR="${VENV_DIR:-$REPO/.venv}"
PY="$VENV_DIR/bin/python"
export PATH="$VENV_DIR/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
DATA=data/demo
if [ ! -f "$DATA/stats.json" ] || [ ! -f "$DATA/pretrained/cnn_tiny_grid.pth" ]; then
  echo "no demo data in $DATA: run ./run_scripts/quickstart.sh first" >&2
  exit 1
fi
launch() {  # horovodrun on this machine, listening on 127.0.0.1 only (src/clipbert_legacy/compat/loopback.py)
  if [ "$NP" -gt 1 ]; then "$PY" -m clipbert_legacy.compat.loopback horovodrun -np "$NP" -H "localhost:$NP" --gloo "$PY" "$@"
  else "$PY" "$@"; fi
}

[ -f "$DATA/txt/stills_train.jsonl" ] || "$PY" -m clipbert_legacy.preprocessing.make_demo_stills --output_dir "$DATA"
launch src/tasks/run_pretrain.py --config configs/demo_pretrain.json --output_dir "$OUT/pretrain" \
  ${PRE_ARGS[@]+"${PRE_ARGS[@]}"}
for name in pretrained scratch; do
  init=()
  [ "$name" = pretrained ] && init=(--e2e_weights_path "$OUT/pretrain/ckpt/model_best.pt")
  # a 2-way linear classifier in both runs: from the checkpoint it starts as the pretraining ITM head
  launch src/tasks/run_video_retrieval.py --config configs/demo_ret.json --output_dir "$OUT/ret_$name" \
    --num_train_epochs "$EPOCHS" --classifier linear "${init[@]}"
  launch src/tasks/run_video_retrieval.py --do_inference 1 --output_dir "$OUT/ret_$name" \
    --inference_model_step -1 --inference_txt_db "$DATA/txt/retrieval_test.jsonl" --inference_img_db "$DATA/vis_db"
done
"$PY" - "$OUT" <<'EOF'
import glob, json, sys
out = sys.argv[1]
pre = [json.loads(x) for x in open(f"{out}/pretrain/log/metrics.jsonl") if '"valid"' in x][-1]
accs = [f"{k.split('_')[0].upper()} acc {pre[k]:.1f}%" for k in ("mlm_acc", "itm_acc") if k in pre]
print(f"\npretraining on the demo stills: {', '.join(accs)}")
print("\n| retrieval fine-tuning | test text->video R@1 | R@5 | video->text R@1 | rsum |")
print("|---|---|---|---|---|")
for name in ("scratch", "pretrained"):
    s = json.load(open(sorted(glob.glob(f"{out}/ret_{name}/results_retrieval_test/*/scores.json"))[-1]))
    t, v = s["text2video"], s["video2text"]
    print(f"| {name} | {t['r1']:.1f} | {t['r5']:.1f} | {v['r1']:.1f} | {s.get('rsum', 0):.1f} |")
EOF
