"""Issue 49: one test per hostile case. Each loads its file in a fresh process under a memory cap
(``RLIMIT_AS``) and a time limit, so a loader that is not bounded fails the test (MemoryError, a kill or
the timeout, which names what it waited for) instead of taking the machine; each refusal is one line
naming the file.

The caps: :data:`CAP_MB` of address space for a process that imports torch (about 750 MB of it is
torch's own mappings), and the files would take gigabytes (2**40 paths, 3 GB inflated, 5x10^7 index
entries, ``/dev/zero`` without end) or forever (a FIFO) without the bounds.
"""
import io
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tests import hostile_files as hf
from tests.mp_utils import REPO, _env, run_python

CAP_MB = 2000
"""Address space each case may use (torch + numpy + PyAV imported: ~750 MB)."""
TIMEOUT_S = 120
"""Seconds each case may take on a busy machine (each takes one or two when bounded)."""


def bounded(code: str, cap_mb: int = CAP_MB, timeout: int = TIMEOUT_S, env=None):
    """Run ``code`` in a fresh Python with ``RLIMIT_AS`` = ``cap_mb`` MB; its stdout and stderr."""
    prelude = (f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({cap_mb} << 20, {cap_mb} << 20))\n"
               "def refusal(f, *a, **k):\n"
               "    try:\n"
               "        out = f(*a, **k)\n"
               "    except Exception as e:\n"
               "        print('REFUSED', type(e).__name__ + ': ' + str(e), flush=True)\n"
               "        return None\n"
               "    print('LOADED', type(out).__name__, flush=True)\n"
               "    return out\n")
    return run_python(["-c", prelude + textwrap.dedent(code)], timeout=timeout, env=env)


def refusals(proc) -> list[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return [ln[len("REFUSED "):] for ln in proc.stdout.splitlines() if ln.startswith("REFUSED ")]


# ------------------------------------------------------------------------------------------ High
def test_a_shared_structure_pkl_as_cnn_weights_is_refused_at_once(tmp_path):
    path = tmp_path / "cnn.pkl"
    hf.write_shared_pkl(path)
    assert path.stat().st_size < 300
    t0 = time.time()
    lines = refusals(bounded(f"""
        from clipbert_legacy.utils.load_save import load_state_dict_file
        refusal(load_state_dict_file, {str(path)!r})"""))
    want = (f"UnsafeFileError: {path} was refused: it holds a structure of more than 5,000,000 nodes once "
            f"its shared parts are unfolded (a few bytes can describe 2**40 paths), which no file of weights "
            f"or training state has; use the file as its publisher released it, or convert it to "
            f".safetensors / a torch.save'd state dict")
    assert lines == [want], lines
    assert time.time() - t0 < TIMEOUT_S


def test_a_shared_structure_restore_file_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    hf.write_shared_restore(ckpt / "restore.pt")
    assert (ckpt / "restore.pt").stat().st_size < 4000
    lines = refusals(bounded(f"""
        from clipbert_legacy.training.checkpoint_files import TrainingRestorer
        refusal(TrainingRestorer({str(ckpt)!r}).load)"""))
    want = f"UnsafeFileError: {ckpt}/restore.pt was refused: it holds a structure of more than 5,000,000"
    assert len(lines) == 1 and lines[0].startswith(want), lines


@pytest.fixture(scope="module")
def deflated_archive(tmp_path_factory):
    """A 3 GB tensor record deflated to a few MB, central-directory extra fields malformed."""
    path = tmp_path_factory.mktemp("zip") / "bomb.pt"
    hf.write_deflated_archive(path, numel=3 * 2 ** 28)
    assert path.stat().st_size < 20 * 2 ** 20
    return path


@pytest.mark.parametrize("as_what", ["restore.pt", "e2e_weights_path"])
def test_an_archive_zipfile_cannot_parse_is_never_given_to_torch(tmp_path, deflated_archive, as_what):
    if as_what == "restore.pt":
        (tmp_path / "ckpt").mkdir()
        target = tmp_path / "ckpt" / "restore.pt"
        os.link(deflated_archive, target)
        call = ("from clipbert_legacy.training.checkpoint_files import TrainingRestorer\n"
                f"refusal(TrainingRestorer({str(target.parent)!r}).load)")
    else:
        target = deflated_archive
        call = ("from clipbert_legacy.utils.load_save import load_state_dict_file\n"
                f"refusal(load_state_dict_file, {str(target)!r})")
    lines = refusals(bounded(call))
    assert len(lines) == 1 and (f"{target} is not an archive torch.save writes: its zip directory does not "
                                f"parse (BadZipFile: Corrupt extra field 1234 (size=16))" in lines[0]), lines


def test_a_deflated_record_with_a_clean_directory_is_refused_too(tmp_path):
    path = tmp_path / "w.pt"
    hf.write_deflated_archive(path, numel=2 ** 24, corrupt_extra=False)
    lines = refusals(bounded(f"""
        from clipbert_legacy.utils.load_save import load_state_dict_file
        refusal(load_state_dict_file, {str(path)!r})"""))
    assert len(lines) == 1 and "is compressed, which torch.save never writes" in lines[0], lines


# ------------------------------------------------------------------------------------------ Medium
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_run_files_linked_to_a_device_are_refused(tmp_path, device):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "restore.pt").symlink_to(device)
    (ckpt / "model_step_1.pt").symlink_to(device)
    (tmp_path / "weights.pt").symlink_to(device)
    lines = refusals(bounded(f"""
        from clipbert_legacy.training.checkpoint_files import TrainingRestorer
        from clipbert_legacy.utils.safe_load import torch_load
        from clipbert_legacy.utils.load_save import load_state_dict_file
        refusal(TrainingRestorer({str(ckpt)!r}).load)
        refusal(torch_load, {str(ckpt / 'model_step_1.pt')!r}, 'fix', follow_symlinks=False)
        refusal(load_state_dict_file, {str(tmp_path / 'weights.pt')!r})""", timeout=60))
    assert lines == [
        f"UnsafeFileError: {ckpt}/restore.pt was refused: it is a symbolic link, and this project never "
        f"writes one there (someone else may have planted it); delete it",
        f"UnsafeFileError: {ckpt}/model_step_1.pt was refused: it is a symbolic link, and this project never "
        f"writes one there (someone else may have planted it); delete it",
        f"UnsafeFileError: {tmp_path}/weights.pt was refused: it is a character device, not a regular "
        f"file (reading it could block or never end); give the path of the file itself"], lines


def test_a_fifo_as_restore_file_is_refused_without_blocking(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.mkfifo(ckpt / "restore.pt")
    lines = refusals(bounded(f"""
        from clipbert_legacy.training.checkpoint_files import TrainingRestorer
        refusal(TrainingRestorer({str(ckpt)!r}).load)""", timeout=60))
    want = (f"UnsafeFileError: {ckpt}/restore.pt was refused: it is a FIFO (named pipe), not a regular file "
            f"(reading it could block or never end); give the path of the file itself")
    assert lines == [want], lines


def test_sigterm_ends_a_process_that_is_loading(tmp_path):
    """Training's handler only records SIGTERM (preemption); while a file loads, SIGTERM ends the process."""
    path = tmp_path / "w.pt"
    torch.save({"w": torch.zeros(3)}, path)
    code = textwrap.dedent(f"""
        import signal, time, torch
        signal.signal(signal.SIGTERM, lambda *a: print("recorded", flush=True))  # as StopSignals does
        from clipbert_legacy.utils.safe_load import torch_load
        torch.load = lambda *a, **k: (print("loading", flush=True), time.sleep(120))  # a load that takes long
        torch_load({str(path)!r}, "fix")
        print("returned", flush=True)""")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "loading"
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)  # the load would have slept 120 s
    finally:
        p.kill()
    assert rc == -signal.SIGTERM


@pytest.fixture(scope="module")
def small_mp4():
    from clipbert_legacy.preprocessing.make_demo_data import encode_mp4
    from tests.test_decoder import indexed_frames
    return encode_mp4(indexed_frames(30, 64), fps=30, size=(64, 64), gop=12)


def test_an_mp4_claiming_50_million_frames_is_refused_before_ffmpeg_indexes_it(tmp_path, small_mp4):
    path = tmp_path / "claims.mp4"
    path.write_bytes(hf.mp4_claiming_frames(small_mp4))
    lines = refusals(bounded(f"""
        from clipbert_legacy.datasets.decoder import decode_clips
        refusal(decode_clips, open({str(path)!r}, "rb").read(), 2, 1)""", cap_mb=1500, timeout=60))
    n = path.stat().st_size
    want = (f"VideoDecodeError: the container's sample tables are out of proportion to its {n} bytes: its "
            f"stsz box claims 50000000 samples of 1 bytes (50000000 bytes) in a file of {n}")
    assert lines == [want], lines


def test_a_training_store_of_hostile_videos_is_bounded_per_worker_and_logs_each_key_once(tmp_path, small_mp4):
    """Eleven hostile videos and three good ones in one store, two epochs with two loader workers: each
    process (the workers inherit the cap) stays within CAP_MB, every batch holds good videos, and each
    bad key is logged once per epoch."""
    from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
    db = tmp_path / "db"
    bad = {f"claims{i}": hf.mp4_claiming_frames(small_mp4, 10 ** 7 * (i + 1)) for i in range(5)}
    bad.update({f"grows{i}": hf.mp4_with_inband_size_change() for i in range(3)})
    bad.update({f"cut{i}": small_mp4[:200 * (i + 1)] for i in range(3)})
    with LMDBWriter(str(db)) as w:
        for k, v in bad.items():
            w.put(k, v)
        for i in range(3):
            w.put(f"good{i}", small_mp4)
    keys = sorted(bad) + [f"good{i}" for i in range(3)]
    p = bounded(f"""
        import logging, sys
        logging.basicConfig(level=logging.WARNING, format="LOG %(message)s", stream=sys.stdout)
        from clipbert_legacy.datasets.build import load_tokenizer
        from clipbert_legacy.datasets.dataset_retrieval import VideoRetrievalCollator, VideoRetrievalDataset
        from clipbert_legacy.datasets.loaders import PrefetchLoader
        from clipbert_legacy.training.data import ResumableDistributedSampler, build_train_dataloader
        from tests.test_datasets import TOK_DIR, _retrieval_groups
        ds = VideoRetrievalDataset(_retrieval_groups({keys!r}), {str(db)!r}, itm_neg_size=1, fps=2, num_frm=2,
                                   max_img_size=32, is_train=True, name="rt", max_frame_pixels=64 * 64 * 3,
                                   max_retries=50, frm_sampling_strategy="uniform")
        sampler = ResumableDistributedSampler(len(ds), seed=1)
        loader = build_train_dataloader(ds, sampler, 4, VideoRetrievalCollator(load_tokenizer(TOK_DIR), 12),
                                        n_workers=2)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            seen = [v for b in PrefetchLoader(loader, None, device="cpu") for v in b["vid_ids"]]
            assert set(seen) <= {{"good0", "good1", "good2"}}, seen  # the loader ends the pass (summary)
            print("EPOCH", epoch, len(seen), flush=True)
        """, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    text = p.stdout
    assert text.count("EPOCH") == 2, text[-3000:]
    for epoch_text in text.split("EPOCH")[:2]:
        logged = [ln.split("bad video ")[1].split()[0] for ln in epoch_text.splitlines()
                  if ": bad video '" in ln]
        assert len(logged) == len(set(logged)), logged  # once per key per epoch
    assert "(bad_index)" in text and "(too_large)" in text


def _unrelated_process():
    return subprocess.Popen(["sleep", "60"], env={"PATH": os.environ["PATH"]})


def test_a_forged_who_entry_cannot_make_the_watchdog_kill_an_unrelated_process(tmp_path):
    """Rank 1's ``who`` entry names an unrelated process of the job's user; the watchdog names rank 1 as
    silent and ends its own process, but signals nothing it cannot prove is the job's."""
    victim = _unrelated_process()
    try:
        p = bounded(f"""
            import datetime, os, socket
            import torch.distributed as dist
            from clipbert_legacy.compat.hvd.torch_backend import peer_watchdog as wd
            from clipbert_legacy.compat._store_auth import start_time
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))
            pid = {victim.pid}
            store.set("p/who1", f"{{socket.gethostname()}} {{pid}} {{start_time(pid)}}")  # the forgery
            wd._end_for(store, "p/", 0, 2, [(1, 61.0)], 60)""",
                    env={"CLIPBERT_JOB_TOKEN": "t" * 32}, timeout=60)
        assert p.returncode == 1, p.stderr[-3000:]
        assert victim.poll() is None, "the unrelated process was killed"
        line = p.stderr.strip().splitlines()[-1]
        assert line.startswith("error: rank 1 (host "), p.stderr[-2000:]
        assert f"pid {victim.pid} not signalled: its environment does not hold this job's token" in line, line
    finally:
        victim.kill()
        victim.wait()


def test_a_planted_lock_symlink_is_refused_and_its_target_untouched(tmp_path):
    from clipbert_legacy.training.run_dir import RunDirectory
    from clipbert_legacy.utils.errors import UnsafeFileError
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".run.lock").symlink_to(victim)
    with pytest.raises(UnsafeFileError, match=r"\.run\.lock was refused: it is a symbolic link"):
        RunDirectory(str(out)).acquire({})
    assert victim.read_text() == "precious\n"


# ------------------------------------------------------------------------------------------ Low
def test_a_pkl_cannot_build_attributes_onto_the_loaders_functions(tmp_path):
    path = tmp_path / "w.pkl"
    path.write_bytes(hf.build_on_function_pickle())
    lines = refusals(bounded(f"""
        from clipbert_legacy.utils import safe_numpy
        from clipbert_legacy.utils.safe_load import load_pickle_weights
        refusal(load_pickle_weights, {str(path)!r})
        print("NAME", safe_numpy.scalar.__name__)"""))
    assert len(lines) == 1 and "asks for attributes set on a function (pickle BUILD)" in lines[0], lines


def test_a_pkl_naming_a_huge_memo_index_stays_small(tmp_path):
    path = tmp_path / "memo.pkl"
    path.write_bytes(hf.c_memo_pickle())
    p = bounded(f"""
        from clipbert_legacy.utils.safe_load import load_pickle_weights
        print("GOT", load_pickle_weights({str(path)!r}))""", cap_mb=1200)
    assert p.returncode == 0 and "GOT None" in p.stdout, p.stderr[-2000:]


def test_state_dict_keys_that_are_not_strings_are_one_line(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({1: torch.zeros(2), "b": torch.zeros(2)}, path)
    lines = refusals(bounded(f"""
        import torch
        from clipbert_legacy.utils.load_save import load_state_dict_with_mismatch
        refusal(load_state_dict_with_mismatch, torch.nn.Linear(2, 2), {str(path)!r})"""))
    want = (f"CheckpointError: {path} is not a state dict: its key 1 is a int, not a parameter name; give a "
            f"file of model weights")
    assert lines == [want], lines


def test_truncated_and_lying_pt_files_in_training_are_one_line(tmp_path):
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(1000)}, buf)
    (tmp_path / "cut.pt").write_bytes(buf.getvalue()[:3000])
    lying = bytearray(buf.getvalue())
    at = lying.find(b"K\x00\x85")  # not there for 1000 elements: patch the storage size in data.pkl instead
    data = bytes(lying).replace(b"M\xe8\x03", b"M\xff\xff")  # 1000 -> 65535 elements in the storage record
    assert at == -1 and data != bytes(lying)
    (tmp_path / "lying.pt").write_bytes(data)
    lines = refusals(bounded(f"""
        from clipbert_legacy.utils.load_save import load_state_dict_file
        refusal(load_state_dict_file, {str(tmp_path / 'cut.pt')!r})
        refusal(load_state_dict_file, {str(tmp_path / 'lying.pt')!r})"""))
    assert len(lines) == 2, lines
    assert all(ln.startswith("CheckpointError: ") and "\n" not in ln for ln in lines), lines
    assert f"{tmp_path}/cut.pt is " in lines[0] and f"{tmp_path}/lying.pt is unreadable" in lines[1], lines


def test_every_safetensors_error_is_one_line(tmp_path):
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(10)}, str(tmp_path / "ok.safetensors"))
    raw = (tmp_path / "ok.safetensors").read_bytes()
    cases = {"cut": raw[:20], "header": (2 ** 40).to_bytes(8, "little") + raw[8:], "empty": b"",
             "json": len(b"{x").to_bytes(8, "little") + b"{x"}
    for name, data in cases.items():
        (tmp_path / f"{name}.safetensors").write_bytes(data)
    calls = "\n".join(f"refusal(load_state_dict_file, {str(tmp_path / (n + '.safetensors'))!r})"
                      for n in cases)
    lines = refusals(bounded("from clipbert_legacy.utils.load_save import load_state_dict_file\n" + calls))
    assert len(lines) == len(cases) and all(ln.startswith("CheckpointError: ") and "is not a readable "
                                            ".safetensors file" in ln for ln in lines), lines


@pytest.mark.parametrize("digits", [4000, 5000])
def test_huge_integers_in_a_config_are_one_line_exit_2(tmp_path, digits):
    path = tmp_path / "c.json"
    path.write_text('{"learning_rate": ' + "9" * digits + "}")
    p = run_python(["src/tasks/run_video_retrieval.py", "--config", path], timeout=TIMEOUT_S)
    assert p.returncode == 2 and p.stderr.strip() == (
        f"config error: --config {str(path)!r}: an integer of {digits} digits (99999999999999999999... "
        f"({digits} chars)); a config value has at most 30"), p.stderr[-2000:]


@pytest.mark.parametrize("extra, message", [
    ({"__class__": 1}, "key '__class__' is not a BertConfig field (a private or special name)"),
    ({"__dict__": {}}, "key '__dict__' is not a BertConfig field (a private or special name)"),
    ({"to_dict": 1}, "key 'to_dict' names a method of BertConfig, not a field"),
    ({"num_attention_heads": 0}, "num_attention_heads=0 is invalid: expected an integer in [1, 4096]"),
    ({"hidden_size": 10 ** 9}, "hidden_size=1000000000 is invalid: expected an integer in [1, 65536]"),
    ({"vocab_size": 2 ** 24, "hidden_size": 2 ** 14}, "more than 20 G"),
])
def test_model_config_keys_and_values_are_checked_against_bertconfig(tmp_path, extra, message):
    from clipbert_legacy.config import ConfigError
    from clipbert_legacy.modeling.build import load_model_config
    raw = json.loads((REPO / "configs/model/tiny_model.json").read_text())
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**raw, **extra}))
    with pytest.raises(ConfigError) as e:
        load_model_config(str(path))
    assert str(e.value).startswith(f"model_config {str(path)!r}: ") and message in str(e.value)


def test_an_inband_size_change_above_the_limit_is_too_large(tmp_path):
    path = tmp_path / "grows.mp4"
    path.write_bytes(hf.mp4_with_inband_size_change(64, 128))
    lines = refusals(bounded(f"""
        from clipbert_legacy.datasets.decoder import decode_clips
        refusal(decode_clips, open({str(path)!r}, "rb").read(), 2, 1, sampling_strategy="uniform",
                max_frame_pixels=64 * 64 * 3)""", cap_mb=1500))
    assert lines == ["VideoDecodeError: a decoded frame is 128x128 (16384 pixels), above "
                     "max_frame_pixels=12288 (the size changes inside the stream)"], lines


def test_forged_store_writes_are_one_line_each_and_the_job_goes_on(caplog):
    """A text heartbeat, non-JSON and unsealed events, a forged LEAVE and a replayed event, written into a
    real TCPStore: each is one warning naming its key; a real operation of two ranks still completes."""
    import datetime
    import logging
    import threading

    import torch.distributed as dist

    from clipbert_legacy.compat._store_auth import seal
    from clipbert_legacy.compat.hvd.torch_backend import peer_watchdog as wd
    from clipbert_legacy.compat.hvd.torch_backend.controller import Controller, Request
    caplog.set_level(logging.WARNING)
    os.environ["CLIPBERT_JOB_TOKEN"] = "s" * 32
    try:
        master = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
        client = lambda: dist.TCPStore("127.0.0.1", master.port, is_master=False,  # noqa: E731
                                       timeout=datetime.timedelta(seconds=30))
        master.set("w/hb1", "forty-two")
        assert wd._read_int(master, "w/hb1") is None
        assert master.get("w/hb1") == b"forty-two"  # the client is still connected
        ran = threading.Event()
        ctl = Controller(0, [0, 1], "hvd/", client, lambda resp, req: ran.set())
        log = "hvd/log"
        master.queue_push(log, b"\xff not json")
        master.queue_push(log, json.dumps({"r": 1, "n": "LEAVE", "k": "LEAVE", "m": {}}))  # unsealed
        event = {"r": 1, "n": "x", "k": "BROADCAST", "m": {"dt": ["float32"], "sh": [[2]], "root": 0,
                                                           "dev": "cpu"}, "q": 1}
        master.queue_push(log, seal(log, event))
        replayed = {"r": 1, "n": "LEAVE", "k": "LEAVE", "m": {}, "q": 1}  # sealed, but an old number
        master.queue_push(log, seal(log, replayed))
        req = Request("x", "BROADCAST", event["m"])
        ctl.submit(req)
        assert req.done.wait(30) and req.error is None and ran.is_set(), req.error
        deadline = time.time() + 10
        while time.time() < deadline and caplog.text.count("store key hvd/log") < 3:
            time.sleep(0.1)
        text = caplog.text
        assert "store key w/hb1: not a counter" in text
        assert "store key hvd/log: unreadable value" in text and "not sealed with the job's token" in text
        assert "a replayed event of rank 1 (number 1, after 1)" in text
        ctl.close(timeout=1)
    finally:
        del os.environ["CLIPBERT_JOB_TOKEN"]


def test_ckpt_and_log_symlinks_are_refused_and_nothing_outside_is_touched(tmp_path):
    from clipbert_legacy.training.run_dir import RunDirectory
    from clipbert_legacy.utils.errors import UnsafeFileError
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("x.tmp123", "model_step_1.pt"):
        (elsewhere / name).write_text("keep me")
    for link in ("ckpt", "log"):
        out = tmp_path / f"out_{link}"
        out.mkdir()
        (out / link).symlink_to(elsewhere, target_is_directory=True)
        with pytest.raises(UnsafeFileError, match=fr"{link}/ of the output folder is a symbolic link"):
            RunDirectory(str(out)).acquire({})
    out = tmp_path / "out_file"
    (out / "log").mkdir(parents=True)
    (out / "log" / "log.txt").symlink_to(elsewhere / "x.tmp123")
    with pytest.raises(UnsafeFileError, match=r"log/log\.txt was refused: it is a symbolic link"):
        RunDirectory(str(out)).acquire({})
    assert sorted(p.name for p in elsewhere.iterdir()) == ["model_step_1.pt", "x.tmp123"]
    assert all(p.read_text() == "keep me" for p in elsewhere.iterdir())


def test_keep_last_k_deletes_only_regular_files_of_this_run(tmp_path):
    from types import SimpleNamespace

    from clipbert_legacy.training.hooks import StepCheckpoints
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    outside = tmp_path / "outside.pt"
    outside.write_text("keep me")
    (ckpt / "model_step_1.pt").symlink_to(outside)  # not a file of this run, a link
    (ckpt / "model_step_2.pt").write_text("not validated by this run")
    hook = StepCheckpoints(keep_last_k=1, keep_top_k=-1)
    trainer = SimpleNamespace(is_main=True, ckpt_dir=str(ckpt), log_dir=str(tmp_path / "log"), global_step=4,
                              cfg=SimpleNamespace(best_metric_mode="auto"))
    hook.history = {1: {"m": 1.0}, 3: {"m": 1.0}}
    hook.before_train(trainer)
    trainer.state = SimpleNamespace(
        validation=SimpleNamespace(step=4, weights={"w": torch.zeros(1)}, weights_finite=True),
        best=SimpleNamespace(metric="m", step=4))
    hook.after_validation(trainer, {"m": 1.0})
    assert outside.read_text() == "keep me" and (ckpt / "model_step_1.pt").is_symlink()
    assert (ckpt / "model_step_2.pt").exists() and (ckpt / "model_step_4.pt").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="start_dockerd.sh starts a daemon only as root")
def test_start_dockerd_refuses_a_log_folder_under_a_world_writable_parent(tmp_path):
    parent = tmp_path / "anyone"
    parent.mkdir()
    parent.chmod(0o777)  # no sticky bit: anyone may rename the 0700 folder inside and plant a link
    (parent / "logs").mkdir(mode=0o700)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "docker").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", DOCKERD_LOG=str(parent / "logs/d.log"))
    p = subprocess.run([str(REPO / "docker/start_dockerd.sh")], capture_output=True, text=True, timeout=60,
                       env=env)
    assert p.returncode == 1 and p.stderr.strip() == (
        f"[start_dockerd] ERROR: folder {parent} above the log folder (mode 777) is writable by others "
        f"without the sticky bit: they could rename the log folder and plant a symlink; use another "
        f"DOCKERD_LOG path")
    assert stat.S_IMODE(parent.stat().st_mode) == 0o777 and not (parent / "logs/d.log").exists()

