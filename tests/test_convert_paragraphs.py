"""DiDeMo and ActivityNet Captions -> paragraph retrieval rows (one per video, the raw sentences in file
order joined by spaces, as CLIP4Clip's public recipe), from tiny files in the public raw formats; bad
entries name the file, the item and its id."""
import json
import re

import pytest

from clipbert_legacy.preprocessing.converters.__main__ import main
from clipbert_legacy.preprocessing.converters.paragraphs import convert_anet, convert_didemo


def _write(path, obj):
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False), encoding="utf-8")
    return path


DIDEMO = [
    {"annotation_id": 1, "video": "1234@N00_55_abc.mp4", "description": "the dog jumps",
     "times": [[3, 3], [2, 4], [3, 4]]},
    {"annotation_id": 2, "video": "1234@N00_55_abc.mp4", "description": "A man  enters the room.",
     "times": [[0, 1], [0, 0]]},
    {"annotation_id": 3, "video": "9_zz.mov", "description": "café lights turn on!", "times": [[5, 5]]},
    {"annotation_id": 4, "video": "1234@N00_55_abc.mp4", "description": "the dog sits", "times": [[2, 2]]},
]


def test_didemo_paragraphs_in_file_order(tmp_path):
    rows = convert_didemo(_write(tmp_path / "train_data.json", DIDEMO))
    assert rows == [  # file order, no full stop added, inner spacing as written (the tokenizer ignores it)
        {"caption": "the dog jumps A man  enters the room. the dog sits", "clip_name": "1234@N00_55_abc"},
        {"caption": "café lights turn on!", "clip_name": "9_zz"},
    ]
    one_line = tmp_path / "val_data.json"
    one_line.write_text(json.dumps(DIDEMO + [{"annotation_id": 7, "video": "x.mp4", "description": 3}]))
    msg = re.escape(f"{one_line}: item[4] (annotation_id 7): field 'description'")
    with pytest.raises(ValueError, match=f"^{msg}"):
        convert_didemo(one_line)  # the release is one line: the item and its id say where


@pytest.mark.parametrize("bad, message", [
    ({"annotation_id": 9, "video": "x.mp4", "times": [[0, 0]]}, "missing field(s) ['description']"),
    ({"annotation_id": 9, "video": "x.mp4", "description": " ", "times": [[0, 0]]}, "non-empty string"),
    ({"annotation_id": 9, "description": "a", "times": [[0, 0]]}, "missing field(s) ['video']"),
    ({"annotation_id": 1, "video": "x.mp4", "description": "a", "times": [[0, 0]]},
     "duplicate annotation_id 1"),
])
def test_didemo_bad_entries_name_file_and_line(tmp_path, bad, message):
    path = _write(tmp_path / "val_data.json", DIDEMO[:1] + [bad])
    with pytest.raises(ValueError) as e:
        convert_didemo(path)
    assert message in str(e.value) and str(e.value).startswith(f"{path}:")


ANET = {
    "v_AAA": {"duration": 30.0, "timestamps": [[10.5, 20.0], [0.0, 9.0]],
              "sentences": ["Then he dives in", " A man stands on a board."]},
    "v_BBB": {"duration": 12.0, "timestamps": [[0, 12]], "sentences": ["Kids play ball ."]},
}


def test_anet_paragraphs_and_cli(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    _write(raw / "train.json", ANET)
    _write(raw / "val_1.json", {"v_CCC": ANET["v_BBB"]})
    assert convert_anet(raw / "train.json") == [
        {"caption": "Then he dives in A man stands on a board.", "clip_name": "v_AAA"},
        {"caption": "Kids play ball .", "clip_name": "v_BBB"}]
    out = tmp_path / "out"
    assert main(["anet_ret", "--raw_dir", str(raw), "--output_dir", str(out)]) == 0
    assert [json.loads(x)["clip_name"] for x in open(out / "train.jsonl")] == ["v_AAA", "v_BBB"]
    # ClipBERT's ANet config validates on dev.jsonl (val_1); test.jsonl only from --test_file
    assert sorted(p.name for p in out.iterdir()) == ["dev.jsonl", "train.jsonl"]
    _write(raw / "val_2.json", {"v_EEE": ANET["v_BBB"]})
    assert main(["anet_ret", "--raw_dir", str(raw), "--test_file", "val_2.json",
                 "--output_dir", str(out)]) == 0
    assert [json.loads(x)["clip_name"] for x in open(out / "test.jsonl")] == ["v_EEE"]
    _write(raw / "val_1.json", {"v_DDD": {"timestamps": [[0, 1]], "sentences": "a b"}})
    fresh = tmp_path / "fresh"
    assert main(["anet_ret", "--raw_dir", str(raw), "--output_dir", str(fresh)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "video 'v_DDD'" in err
    assert "'sentences' must be a non-empty list" in err
    assert not fresh.exists()  # train.json was fine, but nothing is written when val_1.json fails


def test_paragraph_rows_load_as_retrieval_data(tmp_path):
    """The converted file is what the retrieval dataset reads (caption + clip_name per row)."""
    from clipbert_legacy.datasets.dataset_retrieval import mk_retrieval_examples
    rows = convert_didemo(_write(tmp_path / "test_data.json", DIDEMO))
    ex = mk_retrieval_examples(rows)
    assert [e["vid_id"] for e in ex] == ["1234@N00_55_abc", "9_zz"] and ex[0]["txt"].startswith("the dog")
