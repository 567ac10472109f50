"""COCO captions and Visual Genome converters (pretraining captions, VG QA for the VQA config) on tiny
files in the releases' formats: what is held out, what is skipped and counted, one-line errors naming
the file, the item and its id, nothing written when a run fails."""

import json

import pytest

from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.preprocessing.converters import coco, visual_genome
from clipbert_legacy.preprocessing.converters.__main__ import main
from tests import release_raw as raw


@pytest.fixture
def src(tmp_path):
    raw.coco(tmp_path)
    raw.visual_genome(tmp_path)
    return tmp_path


def test_coco_captions_without_karpathy_file_train_is_train2014(src):
    rows, skipped = coco.convert_coco_captions(src / "captions_train2014.json", src / "captions_val2014.json")
    assert {r["coco_id"] for r in rows["coco_train_captions"]} == {raw.coco_stem(i) for i in raw.COCO_TRAIN}
    assert {r["coco_id"] for r in rows["coco_val_captions"]} == {raw.coco_stem(i) for i in raw.COCO_VAL}
    assert rows["coco_train_captions"][0] == {
        "coco_id": "COCO_train2014_000000000009",
        "caption": "A green thing 0.",
    }
    assert skipped == {
        "blank captions": 0,
        "Karpathy-test captions": 0,
        "images outside the Karpathy file": 0,
    }


def coco_cli(src, captions_val, out, **kw):
    """``python -m clipbert_legacy.preprocessing.converters coco_captions`` on the raw train file and
    ``captions_val``."""
    argv = ["coco_captions", "--captions_train", str(src / "captions_train2014.json"), "--captions_val",
            str(captions_val), "--output_dir", str(out)]
    return main(argv, **kw)


def test_coco_errors_name_item_and_id(src, tmp_path, capsys):
    data = json.loads((src / "captions_val2014.json").read_text())
    data["annotations"][1]["image_id"] = 999
    data["annotations"][2]["caption"] = "  "  # blank: skipped and counted
    bad = raw.one_line_json(tmp_path / "bad" / "captions_val2014.json", data)
    out = tmp_path / "out"
    assert coco_cli(src, bad, out) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {bad}: annotations[1] (id 421): image_id 999 is not in the file's 'images' list")
    assert not out.exists()  # the train file converted fine, but nothing is written
    del data["annotations"][1]
    raw.one_line_json(bad, data)
    logged = []
    assert coco_cli(src, bad, out, log=logged.append) == 0
    assert any("coco_train_captions.jsonl: 8 rows; left out: 1 blank captions" in x for x in logged)


def test_vg_captions_hold_out_test_images_and_count_skips(src):
    vg2coco = visual_genome.coco_ids(src / "image_data.json")
    assert vg2coco == {1: 9, 2: 42, 4: 73, 5: 25}
    held = coco.held_out_ids({}, src / "dataset_coco.json")
    assert held == {42}
    rows, skipped = visual_genome.convert_vg_captions(
        src / "region_descriptions.json", vg2coco, held, 1, seed=0
    )
    images = [r["vg_id"] for r in rows["vg_train_captions"] + rows["vg_val_captions"]]
    assert sorted(set(images)) == ["1", "3", "4", "5"] and len(images) == 8  # 2 phrases each, VG 2 held out
    assert len({r["vg_id"] for r in rows["vg_val_captions"]}) == 1
    assert skipped == {"blank phrases": 4, "regions of held-out COCO images": 3}
    with pytest.raises(ValueError, match=r"--n_val_images 4 must be in 1\.\.3"):
        visual_genome.convert_vg_captions(src / "region_descriptions.json", vg2coco, held, 4)


def test_vg_qa_rows_and_errors(src, tmp_path, capsys):
    stems = coco.image_stems([src / "captions_train2014.json", src / "captions_val2014.json"])
    vg2coco = visual_genome.coco_ids(src / "image_data.json")
    # without the Karpathy file every val2014 image is held out (VG 4 = COCO 73 too)
    rows, skipped = visual_genome.convert_vg_qa(
        src / "question_answers.json", vg2coco, stems, set(raw.COCO_VAL), {"red": 0, "no": 1}
    )
    assert rows["vg_k_trainval"][0] == {
        "question": "What color is it?",
        "image_id": "COCO_train2014_000000000009",
        "question_id": "vg9000",
        "labels": {"red": 1.0},
        "answer_type": "other",
    }
    assert [r["image_id"] for r in rows["vg_k_trainval"]] == [raw.coco_stem(9)] * 2 + [raw.coco_stem(25)] * 2
    assert skipped == {
        "QAs on non-COCO images": 3,
        "QAs on held-out COCO images": 6,
        "blank questions/answers": 0,
        "answers outside the VQA vocabulary": 2,
    }
    broken = raw.one_line_json(
        tmp_path / "broken" / "question_answers.json", [{"id": 7, "qas": {"qa_id": 1}}]
    )
    a2l = raw.one_line_json(tmp_path / "a2l.json", {"red": 0})
    assert (
        main(
            [
                "vg_qa",
                "--question_answers",
                broken,
                "--image_data",
                str(src / "image_data.json"),
                "--coco_annotations",
                str(src / "captions_train2014.json"),
                str(src / "captions_val2014.json"),
                "--ans2label",
                a2l,
                "--output_dir",
                str(tmp_path / "o"),
            ]
        )
        == 1
    )
    assert capsys.readouterr().err.strip() == (
        f"error: {broken}: item[0] (id 7): expected {{'id': image id, 'qas': [...]}}"
    )
    out = tmp_path / "o"
    assert (
        main(
            [
                "vg_qa",
                "--question_answers",
                str(src / "question_answers.json"),
                "--image_data",
                str(src / "image_data.json"),
                "--coco_annotations",
                str(src / "captions_train2014.json"),
                str(src / "captions_val2014.json"),
                "--ans2label",
                a2l,
                "--output_dir",
                str(out),
            ]
        )
        == 0
    )
    assert [r["labels"] for r in load_jsonl(str(out / "vg_k_trainval.jsonl"))] == [{"red": 1.0}] * 2


def test_vg_captions_cli_without_karpathy_holds_out_val2014(src, tmp_path):
    out, logged = tmp_path / "out", []
    argv = ["vg_captions", "--region_descriptions", str(src / "region_descriptions.json"), "--image_data",
            str(src / "image_data.json"), "--coco_annotations", str(src / "captions_train2014.json"),
            str(src / "captions_val2014.json"), "--n_val_images", "1", "--output_dir", str(out)]
    assert main(argv, log=logged.append) == 0
    rows = load_jsonl(str(out / "vg_train_captions.jsonl")) + load_jsonl(str(out / "vg_val_captions.jsonl"))
    assert sorted({r["vg_id"] for r in rows}) == ["1", "3", "5"]  # VG 2, 4 are COCO val2014 images 42, 73
    assert any("left out: 3 blank phrases, 6 regions of held-out COCO images" in x for x in logged)
