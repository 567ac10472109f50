"""The batch-size finder (``--find_batch_size``): the search with an injected out-of-memory error at a
given size, the CPU refusal, and a whole run through the engine whose trials leave no trace."""
import json

import pytest
import torch

from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training import batch_size_finder
from clipbert_legacy.training.batch_size_finder import choose, search
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.utils.errors import UserError
from tests.toy_task import ToyTask, toy_argv, toy_cfg


def limit_at(n):
    return lambda b: b <= n


@pytest.mark.parametrize("mode, start, largest, expected, trials", [
    ("power", 2, 37, 32, [2, 4, 8, 16, 32, 64]),
    ("binsearch", 2, 37, 37, [2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]),
    ("power", 50, 37, 25, [50, 25]),  # the start does not fit: halve
    ("binsearch", 50, 37, 37, [50, 25, 37, 43, 40, 38]),
    ("binsearch", 4, 1000, 1000, [4, 8, 16, 32, 64, 128, 256, 512]),  # capped by the data (limit 1000)
    ("binsearch", 5, 4, 4, [5, 2, 3, 4]),  # the failed start is the upper bound, not twice the half
])
def test_search_with_out_of_memory_at_a_size(mode, start, largest, expected, trials):
    found, tried = search(limit_at(largest), start, mode, limit=1000 if largest == 1000 else 4096)
    if largest == 1000:
        assert found == 512 and [b for b, _ in tried] == trials  # 1024 is past the data
    else:
        assert found == expected and [b for b, _ in tried] == trials
    assert all(ok == (b <= largest) for b, ok in tried)


def test_nothing_fits_is_one_line():
    with pytest.raises(UserError, match="even train_batch_size 1 runs out of device memory"):
        search(limit_at(0), 8, "binsearch", limit=100)


def test_safety_margin():
    assert [choose(n) for n in (1, 2, 10, 37, 512)] == [1, 1, 9, 33, 460]


def test_cpu_refuses_with_one_line(tmp_path, capsys):
    assert main("shared", ToyTask, toy_argv(tmp_path / "run", find_batch_size="power")) == 1
    err = capsys.readouterr().err
    assert "error: UserError: find_batch_size needs a CUDA device" in err and "Traceback" not in err


class OomToy(ToyTask):
    """Out of device memory above 6 examples a batch, as a GPU would say it: from the forward as
    torch's OutOfMemoryError, or, from 8 on, from cuBLAS as a plain RuntimeError."""

    def forward_train(self, model, batch, cfg):
        if batch["x"].shape[0] >= 8:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        if batch["x"].shape[0] > 6:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return super().forward_train(model, batch, cfg)


def test_engine_trials_leave_no_trace(tmp_path, monkeypatch, caplog):
    """binsearch from 2 with room for 6: trials 2 4 8 6 7 -> 6, x0.9 -> 5 (accumulation 2 -> keeps
    batch x accumulation >= 4: 1). The run then equals a plain run at batch 5 bit for bit."""
    import logging
    monkeypatch.setattr(batch_size_finder, "check_device", lambda device, world: None)  # CPU stands in
    caplog.set_level(logging.INFO)
    out = tmp_path / "found"
    s = Trainer(toy_cfg(out, train_batch_size=2, gradient_accumulation_steps=2,
                        find_batch_size="binsearch", find_batch_size_keep_effective=1), OomToy()).train()
    assert "tried 2 ok, 4 ok, 8 out of memory, 6 ok, 7 out of memory; largest that fits 6, training with " \
           "train_batch_size 5" in caplog.text
    args = json.load(open(out / "log" / "args.json"))
    assert args["train_batch_size"] == 5 and args["gradient_accumulation_steps"] == 1
    plain = Trainer(toy_cfg(tmp_path / "plain", train_batch_size=5), ToyTask()).train()
    assert s["global_step"] == plain["global_step"] == 13  # ceil(2 epochs x 32 / 5)
    a = torch.load(out / "ckpt" / "model_step_13.pt")
    b = torch.load(tmp_path / "plain" / "ckpt" / "model_step_13.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the same command again: the stored size is kept, no new search, the run is finished
    caplog.clear()
    again = Trainer(toy_cfg(out, train_batch_size=2, gradient_accumulation_steps=2,
                            find_batch_size="binsearch", find_batch_size_keep_effective=1), OomToy()).train()
    assert again["global_step"] == 13 and "keeps train_batch_size 5 x accumulation 1" in caplog.text
