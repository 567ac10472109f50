"""The synthetic demo dataset: deterministic, consistent annotations, and learnable content."""
import json
import os

import numpy as np
import pytest

from clipbert_legacy.datasets.decoder import decode_all_frames
from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.datasets.lmdb_store import LMDBStore
from clipbert_legacy.preprocessing import make_demo_data as mdd


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("demo"))
    assert mdd.main(["--output_dir", out, "--n_train", "40", "--n_val", "10", "--n_test", "12",
                     "--img_size", "48", "--n_frames", "16", "--num_workers", "2",
                     "--cnn_pretrain_steps", "20"]) == 0
    return out


def _rows(demo, name):
    return load_jsonl(os.path.join(demo, "txt", name))


def test_layout_and_stats(demo):
    txt = os.path.join(demo, "txt")
    for split in ("train", "val", "test"):
        for kind in ("retrieval", "frameqa", "action"):
            assert os.path.exists(os.path.join(txt, f"{kind}_{split}.jsonl"))
    assert not os.path.exists(os.path.join(txt, "mc_train.jsonl"))
    stats = json.load(open(os.path.join(demo, "stats.json")))
    assert stats["n_videos"] == {"train": 40, "val": 10, "test": 12}
    assert stats["test"]["retrieval_r1_chance"] == round(100 / 12, 2)
    assert stats["test"]["distinct_combinations"] == 12 and stats["test"]["distinct_captions"] == 12
    store = LMDBStore(os.path.join(demo, "vis_db"))
    assert len(store) == 62
    frames = decode_all_frames(store.get("demo_test_00000"))
    assert frames.shape == (16, 3, 48, 48)
    # the command line also pretrains the demo CNN that the demo configs load
    assert stats["cnn_pretrain"]["steps"] == 20 and stats["cnn_pretrain"]["n_train_videos"] == 40
    assert os.path.isfile(os.path.join(demo, "pretrained", "cnn_tiny_grid.pth"))


def test_annotation_fields_and_labels(demo):
    ans2label = json.load(open(os.path.join(demo, "txt", "ans2label.json")))
    assert sorted(ans2label.values()) == list(range(9))
    ret = _rows(demo, "retrieval_test.jsonl")
    assert len({r["clip_name"] for r in ret}) == len(ret) == 12  # 1:1 caption/video
    for r in _rows(demo, "frameqa_train.jsonl"):
        assert r["answer"] in ans2label and r["answer_type"] in ("color", "object") and "gif_name" in r
    for r in _rows(demo, "action_val.jsonl"):
        assert len(r["options"]) == 5 and len(set(r["options"])) == 5 and 0 <= r["answer"] < 5
    for split in ("train", "val", "test"):  # the CNN pretraining labels agree with every annotation
        attrs = {r["clip_name"]: r for r in _rows(demo, f"attributes_{split}.jsonl")}
        for r in _rows(demo, f"frameqa_{split}.jsonl"):
            a = attrs[r["gif_name"]]
            assert r["answer"] == (a["color"] if r["answer_type"] == "color" else a["shape"])
        for r in _rows(demo, f"action_{split}.jsonl"):
            assert r["options"][r["answer"]] == mdd.MOTION_OPTIONS[attrs[r["gif_name"]]["motion"]]
        assert len(attrs) == len(_rows(demo, f"retrieval_{split}.jsonl"))
    for r, cap in zip(_rows(demo, "mc_test.jsonl"), ret):
        assert r["options"][r["answer"]].split()[1:3] == cap["caption"].split()[1:3]  # colour, shape
        assert len(set(r["options"])) == 5


def _shape_centroid(frame_hwc, rgb):
    dist = np.abs(frame_hwc.astype(int) - np.array(rgb)).sum(-1)
    ys, xs = np.nonzero(dist < 90)
    return xs.mean(), ys.mean(), len(xs)


def test_content_matches_captions(demo):
    """The named colour is on screen and the shape moves the named way (learnable signal)."""
    store = LMDBStore(os.path.join(demo, "vis_db"))
    for r in _rows(demo, "retrieval_val.jsonl"):
        words = r["caption"].split()
        color = words[1]
        frames = decode_all_frames(store.get(r["clip_name"])).permute(0, 2, 3, 1).numpy()
        x0, y0, n0 = _shape_centroid(frames[0], mdd.COLORS[color])
        x1, y1, n1 = _shape_centroid(frames[-1], mdd.COLORS[color])
        assert n0 > 30 and n1 > 30, r
        dx, dy = x1 - x0, y1 - y0
        if "left" in words:
            assert dx < -8 and abs(dy) < 3
        elif "right" in words:
            assert dx > 8 and abs(dy) < 3
        elif "up" in words:
            assert dy < -8 and abs(dx) < 3
        elif "down" in words:
            assert dy > 8 and abs(dx) < 3
        else:
            assert abs(dx) < 2 and abs(dy) < 2


def test_deterministic(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for out in (a, b):
        mdd.build_demo_data(out, n_train=6, n_val=3, n_test=3, img_size=32, n_frames=8, num_workers=1,
                            log=lambda *_: None)
    for name in sorted(os.listdir(os.path.join(a, "txt"))):
        assert open(os.path.join(a, "txt", name)).read() == open(os.path.join(b, "txt", name)).read()
    sa, sb = LMDBStore(os.path.join(a, "vis_db")), LMDBStore(os.path.join(b, "vis_db"))
    assert sa.keys() == sb.keys()
    for k in sa.keys():
        assert (decode_all_frames(sa.get(k)) == decode_all_frames(sb.get(k))).all()
    assert np.array_equal(mdd.render_video("red", "circle", "up", 5),
                          mdd.render_video("red", "circle", "up", 5))
    with pytest.raises(FileExistsError):
        mdd.build_demo_data(a, n_train=2, n_val=1, n_test=1, log=lambda *_: None)


def test_encoding_is_bitwise_repeatable():
    """The clip whose x264 output varied from run to run with x264's SIMD paths (3 distinct mp4s in
    40 encodes here) encodes to the same bytes every time now."""
    v = {x["clip_name"]: x for x in mdd.make_split("train", 1800, 42, 0)}["demo_train_00946"]
    frames = mdd.render_video(v["color"], v["shape"], v["motion"], seed=v["seed"])
    assert len({mdd.encode_mp4(frames) for _ in range(40)}) == 1
