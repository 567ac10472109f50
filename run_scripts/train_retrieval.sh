#!/usr/bin/env bash
# Fine-tune text-to-video retrieval.  NP=8 ./run_scripts/train_retrieval.sh [CONFIG] [OUTPUT_DIR] [extra flags]
#   defaults: configs/msrvtt_ret_base_resnet50.json, /storage/msrvtt_ret
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_launch.sh"
CONFIG="${1:-configs/msrvtt_ret_base_resnet50.json}"; OUT="${2:-/storage/msrvtt_ret}"
launch src/tasks/run_video_retrieval.py --config "$CONFIG" --output_dir "$OUT" "${@:3}"
