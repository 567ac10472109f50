"""load_state_dict_with_mismatch: loads name+shape matches, reports the rest as a table."""
import logging

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from clipbert_legacy.utils.errors import CheckpointError
from clipbert_legacy.utils.load_save import LoadSummary, load_state_dict_with_mismatch


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def _ckpt():
    return {"0.weight": torch.full((3, 4), 1.5), "0.bias": torch.full((3,), 0.5),
            "2.weight": torch.zeros(5, 3),  # shape mismatch
            "extra.weight": torch.ones(7),  # unexpected
            "rpn.head.weight": torch.ones(2, 2)}  # ignored


def test_loads_matching_and_reports_rest(caplog):
    net = _net()
    old_w2 = net[2].weight.detach().clone()
    with caplog.at_level(logging.INFO, logger="clipbert_legacy.utils.load_save"):
        s = load_state_dict_with_mismatch(net, _ckpt(), ignore_prefixes=("rpn.",))
    assert isinstance(s, LoadSummary)
    assert s.loaded == ["0.bias", "0.weight"]
    assert torch.equal(net[0].weight, torch.full((3, 4), 1.5))
    assert torch.equal(net[2].weight, old_w2)  # mismatched shape left untouched
    assert s.missing == ["2.bias"]  # 2.weight is reported as mismatched, not missing
    assert s.unexpected == ["extra.weight"]
    assert s.mismatched == [("2.weight", (5, 3), (2, 3))]
    assert s.ignored == ["rpn.head.weight"]
    assert s["unexpected"] == s.unexpected and s.as_dict()["ignored"] == ["rpn.head.weight"]
    table = caplog.text
    assert "loaded 2 keys; 1 missing, 1 unexpected, 1 shape-mismatched, 1 ignored" in table
    assert "shape mismatch" in table and "5x3" in table and "2x3" in table
    assert "unexpected (not in model) | extra.weight" in table
    assert "ignored (unused)          | rpn.* (1 key)" in table


def test_missing_lists_keys_absent_from_checkpoint():
    s = load_state_dict_with_mismatch(_net(), {"0.weight": torch.ones(3, 4)})
    assert sorted(s.missing) == ["0.bias", "2.bias", "2.weight"]
    rows = [[c.strip() for c in line.split("|")] for line in s.table().splitlines()[3:]]
    assert ["missing in checkpoint", "2.weight", "-", "2x3"] in rows
    assert ["missing in checkpoint", "0.bias", "-", "3"] in rows


@pytest.mark.parametrize("fmt", ["pt", "wrapped", "safetensors", "bin"])
def test_paths_and_wrappers(tmp_path, fmt):
    src = _net()
    sd = {k: v.detach().clone() + 1 for k, v in src.state_dict().items()}
    path = tmp_path / ("w.pt" if fmt == "wrapped" else f"w.{fmt}")
    if fmt == "safetensors":
        save_file(sd, str(path))
    elif fmt == "wrapped":
        torch.save({"model": sd, "iteration": 7}, path)
    else:
        torch.save(sd, path)
    dst = _net()
    s = load_state_dict_with_mismatch(dst, str(path))
    assert sorted(s.loaded) == sorted(sd) and not s.missing and not s.unexpected
    for k, v in dst.state_dict().items():
        assert torch.equal(v, sd[k])


def test_fp16_checkpoint_loads_into_fp32_model():
    sd = {k: v.half() for k, v in _net().state_dict().items()}
    dst = _net()
    load_state_dict_with_mismatch(dst, sd)
    assert dst[0].weight.dtype == torch.float32
    assert torch.equal(dst[0].weight, sd["0.weight"].float())


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_state_dict_with_mismatch(_net(), str(tmp_path / "nope.pt"))
    with pytest.raises(CheckpointError, match="holds a list, not a state dict"):
        load_state_dict_with_mismatch(_net(), [1, 2])
