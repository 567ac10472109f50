"""A toy task added the way docs/adding_a_task.md says, to prove that nothing else has to be edited.

"toy_count": how many of a clip's frames are bright, from synthetic clips (no files). It is a complete
ClipBERT task: its own options (one model-defining, one runtime, one training setting) and post-parse
rule, a dataset builder, a head on the ClipBERT model, an evaluator and an entry point. Its
``task_type`` is unknown to ``clipbert_legacy.modeling.heads.make_head``: the model can only get the task's
head. tests/test_task_registry.py registers it with one call and checks every generated list picks it up.
"""
import sys

import torch
from torch.utils.data import Dataset

from clipbert_legacy.config import ConfigError, Option, TaskSpec
from clipbert_legacy.modeling.heads import QAHead
from clipbert_legacy.tasks.base import ClipBertTask, forward_clips
from clipbert_legacy.tasks.entry import main

TOY_OPTIONS = [
    Option("toy_frames", int, 3, "frames per synthetic clip; the label is the number of bright ones",
           min=1, model=True, group="toy_count"),
    Option("toy_examples", int, 8, "synthetic training clips", min=1, group="toy_count"),
    Option("toy_eval_batches", int, 1, "validation batches", min=1, runtime=True, group="toy_count"),
]


def _toy_post(cfg, _notices):
    if cfg.num_frm != cfg.toy_frames:
        raise ConfigError(f"num_frm={cfg.num_frm} must equal toy_frames={cfg.toy_frames} for toy_count")
    cfg.num_labels = cfg.toy_frames + 1  # 0..toy_frames bright frames
    cfg.task_type = "toy_count"


TOY_COUNT = TaskSpec("toy_count", TOY_OPTIONS, _toy_post)


class ToyClips(Dataset):
    """Clips of ``frames`` 64x64 frames, each bright (1) or dark (-1); one fixed caption."""

    def __init__(self, n, frames, seed):
        g = torch.Generator().manual_seed(seed)
        self.bright = torch.randint(0, 2, (n, frames), generator=g)

    def __len__(self):
        return len(self.bright)

    def __getitem__(self, i):
        frames = self.bright[i].float().mul(2).sub(1).view(-1, 1, 1, 1).expand(-1, 3, 64, 64)
        return frames, int(self.bright[i].sum())


def collate(items):
    n = len(items)
    return {"visual_inputs": torch.stack([f for f, _ in items]),
            "text_input_ids": torch.tensor([[101, 2129, 2116, 102]] * n),
            "text_input_mask": torch.ones(n, 4, dtype=torch.long), "n_examples_list": [1] * n,
            "labels": torch.tensor([y for _, y in items])}


class ToyCountTask(ClipBertTask):
    spec = TOY_COUNT
    name = spec.name
    main_metric = "acc"

    def build_head(self, cfg):
        return QAHead(cfg.num_labels)  # cross-entropy over 0..toy_frames, 2x MLP classifier

    def build_train_data(self, cfg):
        return ToyClips(cfg.toy_examples, cfg.toy_frames, seed=cfg.seed), collate

    def wrap_train_loader(self, loader, _cfg, _device):
        return loader  # synthetic frames are already normalised

    def evaluate(self, model, cfg, _global_step):
        data = ToyClips(4 * cfg.toy_eval_batches, cfg.toy_frames, seed=cfg.seed + 1)
        batch = collate([data[i] for i in range(len(data))])
        logits = forward_clips(model, batch, 1, cfg.num_frm)[0]
        return {"acc": float((logits.argmax(-1) == batch["labels"]).float().mean()) * 100}


if __name__ == "__main__":
    sys.exit(main(ToyCountTask))
