"""Paragraph-to-video retrieval converters: DiDeMo and ActivityNet Captions -> {split}.jsonl.

As in ClipBERT (and CLIP4Clip, Frozen), a video's query is *all* its sentences joined into one
paragraph: one row ``{"caption": paragraph, "clip_name": key}`` per video, read by the ordinary
retrieval dataset (configs/didemo_ret_base_resnet50.json, anet_ret_base_resnet50.json give the longer
``max_txt_len`` and more clips).

Joining follows the public recipe (CLIP4Clip's loaders; ClipBERT's own text files were never
released): the raw sentences in file order, separated by one space, nothing added. File order rather
than a re-sort by time, because it is what the published numbers of that recipe were computed on (so
results compare with them); DiDeMo's moments of a video are separate annotations whose annotators
often disagree on the times, so a re-sort would not give one agreed order either.

* DiDeMo (``{train,val,test}_data.json``): a JSON list of moments ``{"video": file name,
  "description", "times", "annotation_id"}``. Key: the video's file stem.
* ActivityNet Captions (``train.json``, ``val_1.json``, ``val_2.json``): ``{video_id: {"duration",
  "timestamps", "sentences"}}``. Key: the video id (``v_...``, the stem of ActivityNet's files).
  ClipBERT evaluated on ``val_1``.
"""
import json
import os

from clipbert_legacy.preprocessing.converters.common import check_unique, need, read_json_items, text_of


def _paragraph(sentences):
    """The sentences as written, joined by single spaces (nothing added: no full stops, no reordering).
    Only the ends of each sentence are stripped (ANet's have stray spaces); the tokenizer ignores
    whitespace, so the tokens are those of the raw text."""
    return " ".join(s.strip() for s in sentences)


def convert_didemo(path):
    """One paragraph row per video of a DiDeMo json file, videos and sentences in file order."""
    moments, ids = {}, []
    for where, m in read_json_items(path, id_keys=("annotation_id", "video")):
        need(m, where, ("video", "description"))
        key = os.path.splitext(os.path.basename(text_of(m, "video", where)))[0]
        moments.setdefault(key, []).append(text_of(m, "description", where))
        if "annotation_id" in m:
            ids.append((where, m["annotation_id"]))
    check_unique(ids, "annotation_id")
    if not moments:
        raise ValueError(f"{path}: no moments")
    return [{"caption": _paragraph(v), "clip_name": k} for k, v in moments.items()]


def _load_object(path):
    if not os.path.isfile(path):
        raise ValueError(f"{path}: file not found")
    with open(path, encoding="utf-8-sig") as f:
        try:
            data = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path}:{getattr(e, 'lineno', '?')}: invalid JSON ({e})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}:1: expected a non-empty object {{video_id: {{timestamps, sentences}}}}")
    return data


def convert_anet(path):
    """One paragraph row per video of an ActivityNet Captions json file, videos and sentences in file
    order."""
    rows = []
    for vid, v in _load_object(path).items():
        where = f"{path}: video {vid!r}"
        need(v, where, ("sentences",))
        sents = v["sentences"]
        if not isinstance(sents, list) or not sents:
            raise ValueError(f"{where}: field 'sentences' must be a non-empty list of strings, got {sents!r}")
        rows.append({"caption": _paragraph(text_of({"s": s}, "s", f"{where} sentence {i}")
                                           for i, s in enumerate(sents)), "clip_name": vid})
    return rows
