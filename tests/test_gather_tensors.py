"""``allgather_with_tensors`` (the ZeRO restore-file gather, issue 38 item 15) in one process: every
dtype, shape and container comes back bit-equal, as new tensors. The multi-process gather is covered by
test_zero.py (the restore files of sharded runs under torchrun and horovodrun equal the unsharded ones)."""
from collections import OrderedDict

import torch

from clipbert_legacy.utils.distributed import allgather_with_tensors


def _same(a, b):
    if torch.is_tensor(a):
        return (torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_every_tensor_comes_back_bit_equal_and_new():
    nan = torch.tensor([float("nan"), -0.0, float("inf")])
    obj = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(3, 4).t(), "nan": nan},
                     5: {"step": 7, "half": torch.randn(5).half(), "bf16": torch.randn(2, 2).bfloat16()}},
           "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.98), "params": [0, 5]}],
           "flags": torch.tensor([True, False, True]), "empty": torch.zeros(0, 3, dtype=torch.int64),
           "named": OrderedDict(a=torch.arange(5), b=(torch.ones(1, dtype=torch.float64), "x"))}
    (out,) = allgather_with_tensors(obj, "test")
    assert _same(obj, out)
    assert out["state"][0]["exp_avg"].data_ptr() != obj["state"][0]["exp_avg"].data_ptr()
    out["state"][0]["exp_avg"].add_(1)
    assert not torch.equal(out["state"][0]["exp_avg"], obj["state"][0]["exp_avg"])


def test_an_object_without_tensors():
    assert allgather_with_tensors({"a": [1, 2]}, "plain") == [{"a": [1, 2]}]
