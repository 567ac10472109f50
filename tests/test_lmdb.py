"""LMDB writer/CLI (duplicate stems, growing map, failures, --verify) and the lazy reader."""
import io
import os
import pickle

import lmdb
import numpy as np
import pytest

from clipbert_legacy.datasets.lmdb_store import LMDBStore
from clipbert_legacy.preprocessing import file2lmdb
from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
from clipbert_legacy.preprocessing.make_demo_data import encode_mp4
from tests.mp_utils import check, run_python


def _video(n=4, size=32, value=100):
    return encode_mp4((np.full((size, size, 3), value + i, np.uint8) for i in range(n)), fps=10)


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_writer_grows_map_and_round_trips(tmp_path):
    values = {f"k{i}": os.urandom(50_000) for i in range(40)}  # 2 MB into a 256 KiB map
    with LMDBWriter(str(tmp_path / "db"), batch_items=7, map_size=256 * 1024) as w:
        for k, v in values.items():
            w.put(k, v)
    assert w.n_written == 40
    store = LMDBStore(str(tmp_path / "db"))
    assert len(store) == 40 and sorted(store.keys()) == sorted(values)
    assert all(store.get(k) == v for k, v in values.items())
    assert "k3" in store and "nope" not in store


def test_store_missing_key_and_pickle(tmp_path):
    with LMDBWriter(str(tmp_path / "db")) as w:
        w.put("a", b"xyz")
    store = LMDBStore(str(tmp_path / "db"))
    with pytest.raises(KeyError) as ei:
        store.get("video_42")
    assert "video_42" in str(ei.value) and str(tmp_path / "db") in str(ei.value)
    assert store.get("a") == b"xyz"
    clone = pickle.loads(pickle.dumps(store))  # env is not pickled; reopened lazily
    assert clone._env is None and clone.get("a") == b"xyz"
    with pytest.raises(FileNotFoundError, match="file2lmdb"):
        LMDBStore(str(tmp_path / "missing"))


def test_cli_counts_failures_and_verify(tmp_path, capsys):
    root = tmp_path / "videos"
    _write(str(root / "a" / "v1.mp4"), _video())
    _write(str(root / "b" / "v2.avi"), _video(value=50))
    _write(str(root / "b" / "broken.mp4"), b"this is not a video" * 10)
    _write(str(root / "empty.mp4"), b"")
    _write(str(root / "notes.txt"), b"ignored")
    out = tmp_path / "db"
    rc = file2lmdb.main(["--data_root", str(root), "--lmdb_save_dir", str(out), "--ext", "mp4", "avi",
                         "--file_type", "video", "--num_workers", "2", "--verify"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "wrote 3 video files" in text and "1 failed" in text and "empty.mp4: 0 bytes" in text
    assert "verified 3 values" in text and "1 undecodable" in text and "undecodable: broken:" in text
    assert "empty.mp4" in (out / "error_filepaths.log").read_text()
    store = LMDBStore(str(out))
    assert sorted(store.keys()) == ["broken", "v1", "v2"]
    assert store.get("v2") == (root / "b" / "v2.avi").read_bytes()
    # verify-only mode on an existing store
    assert file2lmdb.main(["--lmdb_save_dir", str(out), "--verify"]) == 1
    # output dir must be empty
    assert file2lmdb.main(["--data_root", str(root), "--lmdb_save_dir", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_cli_refuses_duplicate_stems(tmp_path, capsys):
    root = tmp_path / "videos"
    _write(str(root / "x" / "same.mp4"), _video())
    _write(str(root / "y" / "same.mp4"), _video(value=10))
    _write(str(root / "y" / "other.mp4"), _video(value=20))
    rc = file2lmdb.main(["--data_root", str(root), "--lmdb_save_dir", str(tmp_path / "db")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "same" in err and str(root / "x" / "same.mp4") in err and str(root / "y" / "same.mp4") in err
    assert not os.path.exists(tmp_path / "db" / "data.mdb")


def test_images_keep_original_bytes(tmp_path):
    from PIL import Image
    root = tmp_path / "imgs"
    os.makedirs(root)
    buf = io.BytesIO()
    Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3)).save(buf, format="PNG")
    _write(str(root / "im1.png"), buf.getvalue())
    _write(str(root / "bad.png"), b"\x89PNG garbage")
    n, failed = file2lmdb.build_lmdb(str(root), str(tmp_path / "db"), ["png"], "image", 1,
                                     log=lambda *_: None)
    assert n == 2 and failed == []
    assert LMDBStore(str(tmp_path / "db")).get("im1") == buf.getvalue()  # lossless, unlike ClipBERT
    n_checked, bad = file2lmdb.verify_lmdb(str(tmp_path / "db"), "image", 1)
    assert n_checked == 2 and [k for k, _ in bad] == ["bad"]


def test_legacy_script_path(tmp_path):
    root = tmp_path / "v"
    _write(str(root / "clip.mp4"), _video())
    proc = check(run_python(["src/preprocessing/file2lmdb.py", "--data_root", root, "--lmdb_save_dir",
                             tmp_path / "db", "--verify"], timeout=120))
    assert "wrote 1 video files" in proc.stdout and "0 undecodable" in proc.stdout
    env = lmdb.open(str(tmp_path / "db"), readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(b"clip") == (root / "clip.mp4").read_bytes()
    env.close()
