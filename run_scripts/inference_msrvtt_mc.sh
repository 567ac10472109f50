#!/usr/bin/env bash
# MSRVTT multiple-choice inference with a trained retrieval run.
#   NP=8 ./run_scripts/inference_msrvtt_mc.sh OUTPUT_DIR STEP TXT_DB IMG_DB [N_CLIPS] [extra flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_launch.sh"
[ "$#" -ge 4 ] || { echo "usage: $0 OUTPUT_DIR STEP TXT_DB IMG_DB [N_CLIPS] [flags]" >&2; exit 2; }
launch src/tasks/run_msrvtt_mc.py --do_inference 1 --output_dir "$1" --inference_model_step "$2" \
  --inference_txt_db "$3" --inference_img_db "$4" --inference_n_clips "${5:-1}" "${@:6}"
