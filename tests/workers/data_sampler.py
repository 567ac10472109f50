"""Worker for tests/test_datasets.py: each rank iterates a demo retrieval loader for 2 epochs
(2 DataLoader workers reading LMDB) and rank 0 writes every rank's video order as JSON."""
import argparse
import json

import torch

import src.compat.hvd as hvd
from src.datasets.build import build_retrieval_datasets
from src.datasets.loaders import InfiniteIterator, PrefetchLoader, build_dataloader


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cfg", required=True, help="json config")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    cfg = json.load(open(a.cfg))
    ds, col = build_retrieval_datasets(cfg, "train")
    loader = build_dataloader(ds, col, batch_size=2, is_train=True, num_workers=2, seed=7)
    it = iter(InfiniteIterator(PrefetchLoader(loader, None, device="cpu")))
    epochs = [[v for _ in range(len(loader)) for v in next(it)["vid_ids"]] for _ in range(2)]
    shapes = list(next(it)["visual_inputs"].shape)
    gathered = hvd.allgather_object({"rank": hvd.rank(), "size": hvd.size(), "epochs": epochs,
                                     "shape": shapes})
    if hvd.rank() == 0:
        with open(a.out, "w") as f:
            json.dump(gathered, f)


if __name__ == "__main__":
    main()
