"""Train VQA under a launcher and record what each rank ends with: ``vqa_train.py CONFIG OUT_JSON_DIR``.

Every rank writes ``rank{r}.json`` with its validation metrics and a checksum of its final weights, so a
test can check that the ranks agree (one model, one gathered evaluation).
"""
import json
import os
import sys

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config import parse_args
from clipbert_legacy.tasks.run_vqa import VQATask
from clipbert_legacy.training.engine import Trainer

torch.set_num_threads(1)
config, out_dir = sys.argv[1], sys.argv[2]
trainer = Trainer(parse_args("vqa", ["--config", config]), VQATask())
summary = trainer.train()
weights = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump({"size": hvd.size(), "summary": summary, "weights": weights}, f)
