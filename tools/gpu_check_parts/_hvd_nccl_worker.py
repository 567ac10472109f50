"""Worker of the GPU check's Horovod part, launched as ``horovodrun -np 1 --gloo python <this> --out J``.

Under real Horovod (``dist_backend horovod``): an allreduce of a 4 MiB tensor on the training device (NCCL
for a CUDA tensor in a Horovod built with ``HOROVOD_GPU_OPERATIONS=NCCL``), then a few real retrieval
training steps through the engine with ``--fp16 1`` (amp O2, Horovod's DistributedOptimizer) on the tiny
model. Rank 0 writes J.
"""
import argparse
import json
import logging
import math
import os
import tempfile

import torch
from _bench_trainer_worker import BatchTask, engine_cfg  # benchmarks/ is on the driver's PYTHONPATH

from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.training.hooks import Hook

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, VIDEOS, TEXTS, FRAMES, IMG, TXT_LEN = 6, 2, 2, 2, 64, 12
MODEL_CFG = dict(model_config="configs/model/tiny_model.json", task_type="retrieval", loss_type="ce",
                 cnn_type="tiny", cnn_weights_path="")


def batches(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    n_txt = VIDEOS * TEXTS
    return [{"visual_inputs": torch.randn(VIDEOS, FRAMES, 3, IMG, IMG, generator=g),
             "text_input_ids": torch.randint(1000, 2000, (n_txt, TXT_LEN), generator=g),
             "text_input_mask": torch.ones(n_txt, TXT_LEN, dtype=torch.long),
             "n_examples_list": [TEXTS] * VIDEOS, "labels": torch.tensor([1, 0] * VIDEOS)} for _ in range(n)]


class Losses(Hook):
    """Engine hook: each step's loss, loss scale and skip flag."""

    def __init__(self):
        self.steps = []

    def after_step(self, trainer, result):
        self.steps.append({"step": result.step, "loss": result.loss, "loss_scale": result.loss_scale,
                           "skipped": result.skipped})


def allreduce_check(hvd, dev: torch.device) -> dict:
    x = torch.full((1 << 20,), float(hvd.rank() + 1), device=dev)
    y = hvd.allreduce(x, op=hvd.Sum, name="gpu_check_allreduce")
    n = hvd.size()
    return {"device": str(y.device), "elements": x.numel(), "ok": bool((y == n * (n + 1) / 2).all())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    logging.disable(logging.INFO)
    import horovod.torch as real_hvd

    import clipbert_legacy.compat.hvd as hvd
    from clipbert_legacy.modeling.build import build_model
    hvd.set_backend("horovod")
    hvd.init()
    dev = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    out = {"backend": hvd.backend_name(), "size": hvd.size(), "nccl_built": bool(real_hvd.nccl_built()),
           "gloo_built": bool(real_hvd.gloo_built()), "device": str(dev),
           "allreduce": allreduce_check(hvd, dev)}
    torch.manual_seed(0)
    template = build_model({**MODEL_CFG, "model_config": os.path.join(REPO, MODEL_CFG["model_config"])})
    task = BatchTask(template, batches(STEPS), STEPS * hvd.size())
    rec = Losses()
    with tempfile.TemporaryDirectory() as d:
        d = hvd.broadcast_object(d, root_rank=0)
        cfg = engine_cfg(d, STEPS * hvd.size(), fp16=1, dist_backend="horovod")
        trainer = Trainer(cfg, task, hooks=[rec])
        trainer.train()
        out["precision"] = trainer.precision.name
        out["training_device"] = str(trainer.device)
    out["steps"] = rec.steps
    out["losses_finite"] = bool(rec.steps) and all(math.isfinite(s["loss"]) for s in rec.steps)
    if hvd.rank() == 0:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("backend", "nccl_built", "device", "precision")}), flush=True)


if __name__ == "__main__":
    main()
