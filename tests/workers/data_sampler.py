"""Worker for tests/test_datasets.py: each rank iterates a demo retrieval loader for 2 epochs
(2 DataLoader workers reading LMDB) and rank 0 writes every rank's video order as JSON."""
import argparse
import json

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.datasets.build import build_retrieval_datasets
from clipbert_legacy.datasets.loaders import PrefetchLoader
from clipbert_legacy.training.data import ResumableDistributedSampler, build_train_dataloader


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cfg", required=True, help="json config")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    cfg = json.load(open(a.cfg))
    ds, col = build_retrieval_datasets(cfg, "train")
    sampler = ResumableDistributedSampler(len(ds), hvd.size(), hvd.rank(), seed=7)  # the engine's stack
    loader = PrefetchLoader(build_train_dataloader(ds, sampler, 2, col, n_workers=2), None, device="cpu")
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append([v for b in loader for v in b["vid_ids"]])
    shapes = list(next(iter(loader))["visual_inputs"].shape)
    gathered = hvd.allgather_object({"rank": hvd.rank(), "size": hvd.size(), "epochs": epochs,
                                     "shape": shapes})
    if hvd.rank() == 0:
        with open(a.out, "w") as f:
            json.dump(gathered, f)


if __name__ == "__main__":
    main()
