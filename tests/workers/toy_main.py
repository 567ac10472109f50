"""The toy task through the real entry point (``clipbert_legacy.tasks.entry.main``): ``toy_main.py OUT_DIR
JSON_OVERRIDES``; exits with its status (one ``error:`` line on a user error)."""
import json
import sys

import torch

from clipbert_legacy.tasks.entry import main
from tests.toy_task import ToyTask, toy_argv

torch.set_num_threads(1)

sys.exit(main("shared", ToyTask, toy_argv(sys.argv[1], **json.loads(sys.argv[2]))))
