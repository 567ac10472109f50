"""Paragraph-to-video retrieval converters: DiDeMo and ActivityNet Captions -> {split}.jsonl.

As in ClipBERT (and CLIP4Clip, Frozen), a video's query is *all* its sentences joined in temporal
order into one paragraph: one row ``{"caption": paragraph, "clip_name": key}`` per video, read by the
ordinary retrieval dataset (configs/didemo_ret_base_resnet50.json, anet_ret_base_resnet50.json give
the longer ``max_txt_len`` and more clips).

* DiDeMo (``{train,val,test}_data.json``): a JSON list of moments ``{"video": file name,
  "description", "times": [[start, end] segment indices, ...] (one per annotator)}``. Sentences of
  a video are ordered by their earliest start segment (ties: file order). Key: the file stem.
* ActivityNet Captions (``train.json``, ``val_1.json``, ``val_2.json``): ``{video_id: {"duration",
  "timestamps": [[start, end], ...], "sentences": [...]}}``, sentences ordered by start time. Key: the
  video id (``v_...``, the stem of ActivityNet's files). ClipBERT evaluated on ``val_1``.
"""
import json
import os

from src.preprocessing.converters.common import check_unique, need, read_json_items, text_of


def _sentence(text):
    """A sentence ending in one full stop, so that joined sentences read as a paragraph."""
    text = " ".join(text.split())
    return text if text.endswith((".", "!", "?")) else text + "."


def _earliest_start(times, where):
    if not isinstance(times, list) or not times:
        raise ValueError(f"{where}: field 'times' must be a non-empty list of [start, end], got {times!r}")
    try:
        return min(float(t[0]) for t in times)
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"{where}: field 'times' must be a list of [start, end] numbers, got {times!r}") \
            from None


def convert_didemo(path):
    """One paragraph row per video of a DiDeMo json file, videos in order of first appearance."""
    moments, ids = {}, []
    for i, (where, m) in enumerate(read_json_items(path)):
        need(m, where, ("video", "description", "times"))
        key = os.path.splitext(os.path.basename(text_of(m, "video", where)))[0]
        start = _earliest_start(m["times"], where)
        moments.setdefault(key, []).append((start, i, _sentence(text_of(m, "description", where))))
        if "annotation_id" in m:
            ids.append((where, m["annotation_id"]))
    check_unique(ids, "annotation_id")
    if not moments:
        raise ValueError(f"{path}: no moments")
    return [{"caption": " ".join(s for _, _, s in sorted(v)), "clip_name": k} for k, v in moments.items()]


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
    """One paragraph row per video of an ActivityNet Captions json file, in file order."""
    rows = []
    for vid, v in _load_object(path).items():
        where = f"{path}: video {vid!r}"
        need(v, where, ("timestamps", "sentences"))
        stamps, sents = v["timestamps"], v["sentences"]
        ok = isinstance(sents, list) and sents and isinstance(stamps, list) and len(stamps) == len(sents)
        if not ok:
            raise ValueError(f"{where}: needs as many 'timestamps' as 'sentences' (non-empty lists), got "
                             f"{len(stamps) if isinstance(stamps, list) else stamps!r} and "
                             f"{len(sents) if isinstance(sents, list) else sents!r}")
        order = sorted(range(len(sents)), key=lambda i: (_earliest_start([stamps[i]], where), i))
        text = " ".join(_sentence(text_of({"s": sents[i]}, "s", f"{where} sentence {i}")) for i in order)
        rows.append({"caption": text, "clip_name": vid})
    return rows
