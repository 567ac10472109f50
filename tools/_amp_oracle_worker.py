"""One side of tools/amp_oracle.py: train the tiny ClipBERT through
``clipbert_legacy.training.engine.Trainer``
with amp (native or, under ``AMP_BACKEND=apex``, the real apex.amp) and save what the driver compares.

A subprocess per side because the amp backend is module-level state chosen at ``amp.initialize``.
The engine's own precision only offers O2 with apex's defaults; :class:`OraclePrecision` is that
precision with the opt level as a parameter and the dynamic scaler's growth window shortened (set on
the scaler objects after ``initialize``, the same attribute in apex and here) so a few hundred steps
see the scale grow as well as halve. Everything else — accumulation, ``delay_unscale``, Horovod's
``synchronize``/``skip_synchronize``, clipping on ``master_params``, the skipped step — is the engine's.

    python tools/_amp_oracle_worker.py --opt-level O2 --steps 20 --window 3 --inject 2 7 --out side.pt
"""
import argparse
import copy
import json
import logging
import os
import sys
import tempfile

import torch
from _bench_trainer_worker import BatchList, engine_cfg, first

from clipbert_legacy.training import build
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.training.precision import AmpO2Precision
from clipbert_legacy.training.task import Task

# multiplies the loss at the injected steps: loss * 2**40 * loss scale overflows fp16 gradients at any
# scale the dynamic scaler can reach (>= 1), while the fp32 loss itself stays finite (so the engine
# does not count it as a non-finite loss: only amp's overflow check reacts)
INFLATE = 2.0 ** 40
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the tiny ClipBERT (BERT 2x64 + tiny ResNet) with trainable BatchNorm, which O2 keeps fp32
MODEL_CFG = dict(model_config=os.path.join(REPO, "configs", "model", "tiny_model.json"),
                 task_type="retrieval", loss_type="ce", cnn_type="tiny", cnn_norm="BN", cnn_weights_path="")
VIDEOS, TEXTS_PER_VIDEO, FRAMES, IMG, TXT_LEN = 2, 2, 2, 64, 12


def _apex_state():
    """The real apex.amp's state object (its loss scalers), or None on the native side."""
    mod = sys.modules.get("apex.amp._amp_state")
    return None if mod is None else mod._amp_state


class OraclePrecision(AmpO2Precision):
    """The engine's amp precision at ``opt_level`` (dynamic scale; O2 with keep_batchnorm_fp32=True)
    with the scaler's growth window set to ``window`` after initialize."""

    def __init__(self, device, opt_level: str, window: int):
        super().__init__(device)
        self.opt_level, self.window = opt_level, window
        self.name = f"fp16 (amp {opt_level})"

    def prepare(self, model, optimizer):
        # O1 runs batchnorm in fp32 by itself and refuses the option (apex: RuntimeError), so O2 only
        bn = {"keep_batchnorm_fp32": True} if self.opt_level == "O2" else {}
        out = self.amp.initialize(model, optimizer, opt_level=self.opt_level, loss_scale="dynamic",
                                  verbosity=0, **bn)
        state = _apex_state() if self.amp.backend() == "apex" else self.amp._amp_state
        for scaler in state.loss_scalers:
            scaler._scale_seq_len = self.window
        return out


def make_batches(n: int, seed: int) -> list[dict]:
    """``n`` fixed retrieval batches (2 videos x 2 texts, one positive each), the same on both sides."""
    g = torch.Generator().manual_seed(seed)
    n_text = VIDEOS * TEXTS_PER_VIDEO
    return [{"visual_inputs": torch.randn(VIDEOS, FRAMES, 3, IMG, IMG, generator=g),
             "text_input_ids": torch.randint(1, 30522, (n_text, TXT_LEN), generator=g),
             "text_input_mask": torch.ones(n_text, TXT_LEN, dtype=torch.long),
             "n_examples_list": [TEXTS_PER_VIDEO] * VIDEOS,
             "labels": torch.tensor([1, 0] * VIDEOS)} for _ in range(n)]


class OracleTask(Task):
    """Retrieval on fixed batches; the loss of every micro-batch of an injected step is inflated."""

    def __init__(self, template, batches, accum: int, inject: set[int]):
        self.template, self.batches, self.accum, self.inject = template, batches, accum, inject
        self.n_forward = 0

    def build_model(self, cfg):
        return copy.deepcopy(self.template)

    def build_train_data(self, cfg):
        return BatchList(self.batches, len(self.batches)), first

    def forward_train(self, model, batch, cfg):
        step = self.n_forward // self.accum + 1
        self.n_forward += 1
        loss = model(batch)["loss"]
        return loss * INFLATE if step in self.inject else loss

    def evaluate(self, model, cfg, global_step):
        return {"loss": 0.0}

    def model_config(self, cfg):
        return None


def fingerprint(trainer) -> float:
    """Sum of the fp32 weights the optimizer updates: unchanged exactly when a step is skipped."""
    params = trainer.precision.master_params(trainer.optimizer)
    return float(sum(p.detach().double().sum() for p in params))


class Recorder(Hook):
    """Per step: loss, loss scale and unskipped count after it, skipped, grad norm, weights changed."""

    def __init__(self):
        self.records, self._fp = [], None

    def before_train(self, trainer):
        self._fp = fingerprint(trainer)

    def after_step(self, trainer, result):
        fp = fingerprint(trainer)
        sd = trainer.precision.state_dict()
        self.records.append({"step": result.step, "loss": result.loss, "loss_scale": result.loss_scale,
                             "unskipped": int(next(iter(sd.values()))["unskipped"]),
                             "skipped": result.skipped, "skipped_total": result.skipped_total,
                             "grad_norm": result.grad_norm, "weights_changed": fp != self._fp})
        self._fp = fp


def final_state(trainer) -> dict:
    """Masters and the weights the model runs with (its own dtypes), as CPU tensors; amp.state_dict()."""
    masters = trainer.precision.masters_by_name(trainer.optimizer)
    model = {**dict(trainer.model.named_parameters()), **dict(trainer.model.named_buffers())}
    return {"masters": {n: p.detach().cpu().clone() for n, p in masters.items()},
            "model": {n: t.detach().cpu().clone() for n, t in model.items()},
            "amp_state_dict": {k: dict(v) for k, v in trainer.precision.state_dict().items()}}


def run(a) -> dict:
    """Train ``a.steps`` steps on one process and return the records and final state."""
    torch.manual_seed(a.seed)
    from clipbert_legacy.modeling.build import build_model
    template = build_model(MODEL_CFG)
    inject = set(a.inject)
    task = OracleTask(template, make_batches(a.steps * a.accum, a.seed), a.accum, inject)
    build.build_precision = lambda cfg, device: OraclePrecision(device, a.opt_level, a.window)
    recorder = Recorder()
    with tempfile.TemporaryDirectory() as out:
        cfg = engine_cfg(out, a.steps * a.accum, fp16=1, gradient_accumulation_steps=a.accum,
                         grad_norm=a.grad_norm, seed=a.seed)
        trainer = Trainer(cfg, task, hooks=[recorder])
        trainer.train()
        from clipbert_legacy.compat import amp
        return {"backend": amp.backend(), "opt_level": a.opt_level, "device": str(trainer.device),
                "torch": str(torch.__version__), "records": recorder.records, **final_state(trainer)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--opt-level", choices=["O1", "O2"], required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--grad-norm", type=float, default=1.0)
    ap.add_argument("--window", type=int, default=2000, help="the dynamic scaler's growth window")
    ap.add_argument("--inject", type=int, nargs="*", default=[], help="1-based steps whose loss overflows")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", required=True, help="torch.save'd result")
    a = ap.parse_args()
    logging.disable(logging.WARNING)  # the overflow messages and the engine's info lines
    if os.environ.get("AMP_ORACLE_DETERMINISTIC") == "1":
        torch.use_deterministic_algorithms(True, warn_only=True)  # a missing kernel must not end the run
    result = run(a)
    torch.save(result, a.out)
    print(json.dumps({"backend": result["backend"], "steps": len(result["records"])}))


if __name__ == "__main__":
    main()
