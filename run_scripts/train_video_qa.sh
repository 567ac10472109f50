#!/usr/bin/env bash
# Fine-tune video QA.  NP=8 ./run_scripts/train_video_qa.sh TASK [OUTPUT_DIR] [extra flags]
#   TASK: msrvtt_qa | action | transition | frameqa  (config configs/{msrvtt_qa,tgif_qa_TASK}_base_resnet50.json)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_launch.sh"
TASK="${1:?usage: $0 msrvtt_qa|action|transition|frameqa [OUTPUT_DIR] [flags]}"
case "$TASK" in
  msrvtt_qa) CONFIG=configs/msrvtt_qa_base_resnet50.json ;;
  action|transition|frameqa) CONFIG="configs/tgif_qa_${TASK}_base_resnet50.json" ;;
  *) echo "unknown task '$TASK': use msrvtt_qa, action, transition or frameqa" >&2; exit 2 ;;
esac
launch src/tasks/run_video_qa.py --config "$CONFIG" --output_dir "${2:-/storage/$TASK}" "${@:3}"
