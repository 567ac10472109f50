"""VQA 2.0 converter (src/clipbert_legacy/preprocessing/converters/vqa.py) on tiny files in visualqa.org's
format: the official answer normalisation on crafted answers, exact output rows, the vocabulary rule, the
image keys, one-line errors naming the file, and the CLI."""
import json
import os

import pytest

from clipbert_legacy.datasets.dataset_vqa import mk_vqa_examples
from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.preprocessing.converters import vqa
from clipbert_legacy.preprocessing.converters.__main__ import main


@pytest.mark.parametrize("raw,expect", [
    ("Two", "2"), ("none", "0"), ("The dog.", "dog"), ("a red, white bus", "red white bus"),
    ("red,white", "red white"), ("1,000", "1000"), ("3.5", "3.5"), ("mr. smith", "mr smith"),
    ("t-shirt", "t shirt"), ("yes!", "yes"), ("dont", "don't"), ("couldntve", "couldn't've"),
    ("couldn'tve", "couldn't've"), ("its", "its"), ("well", "well"), ("  Yes\n", "yes"),
    ("an apple and the pear", "apple and pear"), ("left / right", "left right"),
    ("(a) 10 %", "10 %"), ("wasnt", "wasn't"), ("what's", "what's"),
])
def test_answer_normalisation(raw, expect):
    assert vqa.normalize_answer(raw) == expect


def _human(answers):
    return [{"answer": a, "answer_confidence": "yes", "answer_id": i + 1} for i, a in enumerate(answers)]


def _write_split(raw, sub, questions, annotations=None):
    os.makedirs(raw, exist_ok=True)
    with open(os.path.join(raw, vqa.QUESTIONS.format(sub)), "w") as f:
        json.dump({"data_subtype": sub, "questions": questions}, f, indent=1)
    if annotations is not None:
        with open(os.path.join(raw, vqa.ANNOTATIONS.format(sub)), "w") as f:
            json.dump({"data_subtype": sub, "annotations": annotations}, f, indent=1)


def _ann(qid, img, answers, mc, atype="other"):
    return {"question_id": qid, "image_id": img, "answers": _human(answers), "multiple_choice_answer": mc,
            "answer_type": atype, "question_type": "what color"}


def _raw(tmp_path):
    raw = str(tmp_path / "raw")
    train_q = [{"image_id": 9, "question": "What color is it?", "question_id": 90},
               {"image_id": 9, "question": "How many dogs?", "question_id": 91},
               {"image_id": 25, "question": "What color is the bus?", "question_id": 250}]
    _write_split(raw, "train2014", train_q, [
        _ann(90, 9, ["Red"] * 6 + ["red."] * 2 + ["dark red"] * 2, "red"),
        _ann(91, 9, ["two"] * 5 + ["2"] * 2 + ["3"] * 3, "Two", "number"),
        _ann(250, 25, ["red"] * 9 + ["white"], "red")])
    _write_split(raw, "val2014", [{"image_id": 42, "question": "Is it a cat?", "question_id": 420}],
                 [_ann(420, 42, ["yes"] * 10, "yes", "yes/no")])
    _write_split(raw, "test-dev2015", [{"image_id": 7, "question": "Why?", "question_id": 70}])
    return raw


def test_convert_rows_vocab_and_image_keys(tmp_path):
    rows, ans2label = vqa.convert_vqa_k(_raw(tmp_path), min_count=1)
    assert sorted(rows) == ["vqa_k_test", "vqa_k_trainval", "vqa_test_dev"]
    first = rows["vqa_k_trainval"][0]
    assert first == {"question": "What color is it?", "question_id": 90,
                     "image_id": "COCO_train2014_000000000009", "answers": ["red"] * 8 + ["dark red"] * 2,
                     "answer_type": "other", "question_type": "what color"}
    assert rows["vqa_k_trainval"][1]["answers"] == ["2"] * 7 + ["3"] * 3  # "two" and "2" are one answer
    assert rows["vqa_test_dev"] == [{"question": "Why?", "question_id": 70,
                                 "image_id": "COCO_test2015_000000000007"}]  # test-dev uses test2015 images
    assert ans2label == {"red": 0, "2": 1}  # trainval multiple-choice answers, most frequent first
    # the dataset's soft scores from the normalised answers: min(#humans / 3, 1)
    ex = mk_vqa_examples(rows["vqa_k_trainval"][:2])
    assert ex[0]["labels"] == {"red": 1.0, "dark red": 2 / 3} and ex[1]["labels"] == {"2": 1.0, "3": 1.0}
    # Karpathy test = {42}: its val2014 question is the test file and its answer is not counted
    rows, ans2label = vqa.convert_vqa_k(_raw(tmp_path), min_count=1, style="id", karpathy_test={42})
    assert rows["vqa_k_test"][0]["image_id"] == "42" and "yes" not in ans2label
    with pytest.raises(ValueError, match="no val2014 question is on a Karpathy-test image"):
        vqa.convert_vqa_k(_raw(tmp_path), min_count=1, karpathy_test={5})


def test_cli_writes_clipberts_files(tmp_path):
    """ClipBERT's VQA config reads vqa_k_trainval.jsonl, vqa_k_test.jsonl, trainval_ans2label.json:
    without a Karpathy split file val2014 is the held-out test, train2014 the training file."""
    out, logged = tmp_path / "out", []
    assert main(["vqa", "--raw_dir", _raw(tmp_path), "--output_dir", str(out), "--min_count", "1"],
                log=logged.append) == 0
    assert sorted(os.listdir(out)) == ["trainval_ans2label.json", "vqa_k_test.jsonl", "vqa_k_trainval.jsonl",
                                       "vqa_test_dev.jsonl"]
    assert len(load_jsonl(str(out / "vqa_k_trainval.jsonl"))) == 3
    assert [r["question_id"] for r in load_jsonl(str(out / "vqa_k_test.jsonl"))] == [420]
    assert json.load(open(out / "trainval_ans2label.json")) == {"red": 0, "2": 1}
    assert any("trainval_ans2label.json: 2 answers" in line for line in logged)


def test_errors_name_the_file_and_the_fix(tmp_path, capsys):
    raw = _raw(tmp_path)
    with pytest.raises(ValueError, match="no answer occurs 9 times in vqa_k_trainval; lower --min_count"):
        vqa.convert_vqa_k(raw)
    _write_split(raw, "val2014", [{"image_id": 42, "question": "Is it a cat?", "question_id": 420},
                                  {"image_id": 42, "question": "Is it a dog?", "question_id": 421}],
                 [_ann(420, 42, ["yes"] * 10, "yes", "yes/no")])
    with pytest.raises(ValueError, match=r"v2_mscoco_val2014_annotations.json: no annotation for 1 "
                                         r"question\(s\).*question_id 421"):
        vqa.convert_vqa_k(raw, min_count=1)
    _write_split(raw, "val2014", [{"image_id": -1, "question": "Is it a cat?", "question_id": 420}])
    assert main(["vqa", "--raw_dir", raw, "--output_dir", str(tmp_path / "o"), "--min_count", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "v2_OpenEnded_mscoco_val2014_questions.json:" in err
    assert "image_id must be a non-negative integer, got -1" in err and "\n" not in err
    os.remove(os.path.join(raw, vqa.ANNOTATIONS.format("val2014")))
    with pytest.raises(ValueError, match="v2_mscoco_val2014_annotations.json: file not found "
                                         r"\(vqa_k_trainval/vqa_k_test need the train2014 and val2014"):
        vqa.convert_vqa_k(raw, min_count=1)
