"""Compare every file two training runs wrote: checkpoints tensor by tensor, JSON by value, log.txt,
metrics.jsonl and TensorBoard events but for what measures time (timestamps, durations, throughput,
memory) and the output directory's own path."""
import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import torch

TIMING_KEYS = {"time", "examples_per_s", "data_wait_ratio", "comm_wait_ratio", "memory_mb"}
_LOG_TIME = re.compile(r"^\d\d/\d\d/\d{4} \d\d:\d\d:\d\d - ")
_LOG_DURATIONS = re.compile(r"[\d.]+ ex/s data wait \d+% allreduce wait \d+% mem \d+ MB")


def assert_same_value(a, b, where="") -> None:
    """Equal structure and values; tensors and arrays bitwise (dtype and shape too), nan equal to nan."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        assert torch.is_tensor(a) and torch.is_tensor(b), where
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert np.array_equal(np.asarray(a), np.asarray(b)), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(set(a) ^ set(b)))
        for k in a:
            assert_same_value(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_value(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, (where, a, b)


def _text(path: Path, out: Path) -> str:
    return path.read_text().replace(str(out), "<OUT>")


def _log_lines(path: Path, out: Path) -> list[str]:
    """log.txt without timestamps and durations, sorted: the lines hooks log at a step come in the
    hooks' order, which is all a different order of hooks may change there."""
    lines = [_LOG_DURATIONS.sub("<perf>", _LOG_TIME.sub("", x)) for x in _text(path, out).splitlines()]
    return sorted(lines)


def _jsonl(path: Path, out: Path) -> list[dict]:
    rows = [json.loads(x) for x in _text(path, out).splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def tensorboard_scalars(path: Path) -> list[tuple]:
    """``(tag, step, value)`` of every scalar in a tensorboard event file, in order (wall times left out)."""
    from tensorboardX.proto import event_pb2
    data, i, out = path.read_bytes(), 0, []
    while i < len(data):
        n = struct.unpack("<Q", data[i:i + 8])[0]
        ev = event_pb2.Event()
        ev.ParseFromString(data[i + 12:i + 12 + n])
        out += [(v.tag, ev.step, v.simple_value) for v in ev.summary.value if not v.tag.startswith("perf/")]
        i += 12 + n + 4
    return out


def _files(out: Path) -> dict[str, Path]:
    """Relative name -> path; a tensorboard file is named by its place in order (not time, host, pid)."""
    files, events = {}, sorted(p for p in out.rglob("events.out.tfevents.*"))
    for p in out.rglob("*"):
        if p.is_file():
            files[str(p.relative_to(out))] = p
    for i, p in enumerate(events):
        del files[str(p.relative_to(out))]
        files[str(p.parent.relative_to(out) / f"events.out.tfevents.<{i}>")] = p
    return files


def assert_same_run_files(a: Path, b: Path) -> None:
    """Every file of run directory ``a`` is in ``b`` and holds the same (see the module docstring)."""
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb), sorted(set(fa) ^ set(fb))
    for name in sorted(fa):
        pa, pb = fa[name], fb[name]
        if name == ".run.lock":  # the holder's pid and start time
            continue
        if name.endswith(".pt"):
            assert_same_value(torch.load(pa, weights_only=True), torch.load(pb, weights_only=True), name)
        elif name.endswith("log.txt"):
            assert _log_lines(pa, a) == _log_lines(pb, b), name
        elif name.endswith(".jsonl"):
            assert _jsonl(pa, a) == _jsonl(pb, b), name
        elif name.endswith(".json"):
            assert json.loads(_text(pa, a)) == json.loads(_text(pb, b)), name
        elif "events.out.tfevents" in name:
            assert tensorboard_scalars(pa) == tensorboard_scalars(pb), name
        else:
            raise AssertionError(f"{name}: a file the comparison does not know; add how to compare it")
