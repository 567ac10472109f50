"""DataLoader worker settings (src/clipbert_legacy/utils/loader_workers.py): a too-small /dev/shm is a
one-line error before any worker starts, and a stalled worker ends the loader after the timeout instead of
hanging it."""
import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from clipbert_legacy.training.data import build_train_dataloader
from clipbert_legacy.utils.errors import UserError, one_line
from clipbert_legacy.utils.loader_workers import SharedMemoryError, check_shared_memory, worker_settings


def _free_mb(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / 2 ** 20


def test_small_shm_is_a_one_line_error_naming_the_fixes(tmp_path):
    need = _free_mb(tmp_path) + 1024
    with pytest.raises(SharedMemoryError) as e:
        check_shared_memory(2, shm_dir=str(tmp_path), min_mb=need)
    line = one_line(e.value)
    assert line.startswith(f"SharedMemoryError: {tmp_path} has ") and "n_workers=2" in line
    for fix in ("--shm-size 1g", "--ipc=host", "--n_workers 0"):
        assert fix in line
    assert isinstance(e.value, UserError)  # the entry points print it as one line, exit status 1
    check_shared_memory(0, shm_dir=str(tmp_path), min_mb=need)  # no workers: no shared memory needed
    check_shared_memory(2, shm_dir=str(tmp_path), min_mb=1)


def test_the_limit_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr("clipbert_legacy.utils.loader_workers.SHM_DIR", str(tmp_path))
    monkeypatch.setenv("CLIPBERT_MIN_SHM_MB", str(int(_free_mb(tmp_path)) + 1024))
    with pytest.raises(SharedMemoryError):
        check_shared_memory(1, shm_dir=str(tmp_path))
    monkeypatch.setenv("CLIPBERT_MIN_SHM_MB", "0")
    check_shared_memory(1, shm_dir=str(tmp_path))


def test_worker_settings_carry_a_timeout(monkeypatch):
    monkeypatch.setenv("CLIPBERT_MIN_SHM_MB", "0")
    monkeypatch.delenv("CLIPBERT_LOADER_TIMEOUT_S", raising=False)
    assert worker_settings(0) == {"num_workers": 0}
    assert worker_settings(3) == {"num_workers": 3, "timeout": 300.0}
    monkeypatch.setenv("CLIPBERT_LOADER_TIMEOUT_S", "7.5")
    assert worker_settings(1)["timeout"] == 7.5


def test_the_train_loader_checks_before_any_worker_starts(monkeypatch):
    monkeypatch.setenv("CLIPBERT_MIN_SHM_MB", str(10 ** 9))
    with pytest.raises(SharedMemoryError, match="--shm-size"):
        build_train_dataloader(list(range(4)), sampler=None, batch_size=2, n_workers=1)
    assert build_train_dataloader(list(range(4)), sampler=None, batch_size=2, n_workers=0).num_workers == 0


class _StallsInWorkers(Dataset):
    """Item 1 never comes back from a worker (a worker blocked on a full /dev/shm, a hung decoder)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 1:
            time.sleep(120)
        return torch.full((2,), i)


def test_a_stalled_worker_ends_the_loader_after_the_timeout(monkeypatch):
    monkeypatch.setenv("CLIPBERT_MIN_SHM_MB", "0")
    monkeypatch.setenv("CLIPBERT_LOADER_TIMEOUT_S", "3")
    loader = DataLoader(_StallsInWorkers(), batch_size=1, **worker_settings(1))
    t = time.time()
    got = []
    with pytest.raises(RuntimeError, match="DataLoader timed out after 3"):
        for b in loader:
            got.append(int(b[0, 0]))
    assert got == [0] and time.time() - t < 60
