"""MSRVTT retrieval (train/val/test jsonl) and MSRVTT multiple choice (MSR_MC_test.csv) converters.

Raw inputs:
  - MSRVTT's video-data json (`train_val_videodatainfo.json`, `test_videodatainfo.json`, or CLIP4Clip's merged
    `MSRVTT_data.json`): {"videos": [{video_id, split, ...}], "sentences": [{video_id, caption, sen_id}]}.
  - a train list: a CSV with a `video_id` column (JSFusion/CLIP4Clip's `MSRVTT_train.7k.csv` or
    `MSRVTT_train.9k.csv`); without one, the official train+validate videos (7,010: the "7k" split
    ClipBERT trained on).
  - the 1k-A test split (JSFusion's `MSRVTT_JSFUSION_test.csv`: key, vid_key, video_id, sentence):
    1,000 videos with one caption each.
  - `MSR_MC_test.csv` (JSFusion's; tab-separated: key, vid_key (msrNNNN), a1..a5, answer 0-based;
    a `video_id` column is accepted instead of vid_key).

Output rows are what the retrieval and MC datasets read: {caption, clip_name} and
{qid, clip_name, options[5], answer}; clip_name is MSRVTT's video id ("video7020"), the file stem
file2lmdb uses as LMDB key. ClipBERT's own val file is not public: val.jsonl is `n_val_videos`
training videos held out (seeded, first caption each), or with 0 the 1k-A test rows (what CLIP4Clip
validates on).
"""
import random

from clipbert_legacy.preprocessing.converters.common import (
    check_unique,
    int_of,
    need,
    read_json_items,
    read_table,
    text_of,
)

TRAIN_SPLITS = ("train", "validate")


def load_videodata(paths):
    """{video_id: split} and [(where, video_id, caption)] over the MSRVTT video-data json files."""
    splits, caps, vid_where, sen_ids = {}, [], [], []
    for path in paths:
        for where, v in read_json_items(path, "videos", ("video_id", "id")):
            need(v, where, ("video_id",))
            vid = text_of(v, "video_id", where)
            if vid in splits and splits[vid] != v.get("split"):
                raise ValueError(f"{where}: video {vid!r} listed again with split {v.get('split')!r} "
                                 f"(was {splits[vid]!r})")
            splits[vid] = v.get("split")
            vid_where.append((where, vid))
        for where, s in read_json_items(path, "sentences", ("sen_id", "video_id")):
            need(s, where, ("video_id", "caption"))
            vid = text_of(s, "video_id", where)
            if vid not in splits:
                raise ValueError(f"{where}: caption for video {vid!r}, which no 'videos' entry lists")
            caps.append((where, vid, text_of(s, "caption", where)))
            if "sen_id" in s:
                sen_ids.append((where, s["sen_id"]))
    check_unique(sen_ids, "sen_id")
    return splits, caps


def train_videos(splits, train_list=None):
    """Ordered training video ids: the list's `video_id` column, else the official train+validate."""
    if train_list is None:
        return [v for v, s in splits.items() if s in TRAIN_SPLITS]
    rows = read_table(train_list, ("video_id",), ",")
    check_unique([(w, r["video_id"].strip()) for w, r in rows], "video_id")
    for where, r in rows:
        if r["video_id"].strip() not in splits:
            raise ValueError(f"{where}: video {r['video_id'].strip()!r} is not in the video-data json")
    return [r["video_id"].strip() for _, r in rows]


def test_rows(test_csv):
    """1k-A rows {caption, clip_name} from JSFusion's test csv, in file order."""
    rows = read_table(test_csv, ("video_id", "sentence"), ",")
    out = [{"caption": text_of(r, "sentence", w), "clip_name": text_of(r, "video_id", w)} for w, r in rows]
    check_unique([(w, o["clip_name"]) for (w, _), o in zip(rows, out)], "test video_id")
    return out


def convert_retrieval(videodata, test_csv, train_list=None, n_val_videos=0, seed=42):
    """{"train": rows, "val": rows, "test": rows} (see module docstring)."""
    splits, caps = load_videodata(videodata)
    train = train_videos(splits, train_list)
    test = test_rows(test_csv)
    overlap = sorted(set(train) & {r["clip_name"] for r in test})
    if overlap:
        raise ValueError(f"{test_csv}: {len(overlap)} test video(s) are also training videos, e.g. "
                         f"{overlap[:5]}; use the 7k/9k list that excludes the 1k-A test")
    by_vid = {}
    for _, vid, cap in caps:
        by_vid.setdefault(vid, []).append(cap)
    if not 0 <= n_val_videos < len(train):
        raise ValueError(f"n_val_videos={n_val_videos} must be in 0..{len(train) - 1}")
    val_vids = set(random.Random(seed).sample(sorted(train), n_val_videos)) if n_val_videos else set()
    no_caps = [v for v in train if v not in by_vid]
    if no_caps:
        raise ValueError(f"{len(no_caps)} training video(s) have no caption, e.g. {no_caps[:5]}")
    rows = {"train": [{"caption": c, "clip_name": v} for v in train if v not in val_vids for c in by_vid[v]],
            "test": test}
    rows["val"] = ([{"caption": by_vid[v][0], "clip_name": v} for v in train if v in val_vids]
                   if val_vids else list(test))
    return rows


def _mc_video(r, where):
    """The LMDB key of an MC row: ``video_id`` as is, else JSFusion's ``vid_key`` ``msrNNNN`` ->
    ``videoNNNN``."""
    if (r.get("video_id") or "").strip():
        return text_of(r, "video_id", where)
    vid_key = text_of(r, "vid_key", where)
    if not (vid_key.startswith("msr") and vid_key[3:].isdigit()):
        raise ValueError(f"{where}: vid_key must be 'msr' + the MSRVTT video number (msr7020), "
                         f"got {vid_key!r}")
    return "video" + vid_key[3:]


def convert_mc(mc_csv):
    """MSR_MC_test.csv -> [{qid, clip_name, options, answer}]; qid is the row index (0-based).

    The file is tab-separated with a header; columns are taken by name: ``a1``..``a5``, ``answer``
    (0-based) and the video as ``vid_key`` (JSFusion's ``msrNNNN``) or ``video_id`` (``videoNNNN``)."""
    table = read_table(mc_csv, tuple(f"a{i}" for i in range(1, 6)) + ("answer",), "\t")
    if table and not ({"vid_key", "video_id"} & set(table[0][1])):
        raise ValueError(f"{mc_csv}:1: header lacks a video column: expected 'vid_key' (msrNNNN) or "
                         f"'video_id' (videoNNNN); found {list(table[0][1])}")
    out = []
    for where, r in table:
        out.append({"qid": len(out), "clip_name": _mc_video(r, where),
                    "options": [text_of(r, f"a{i}", where) for i in range(1, 6)],
                    "answer": int_of(r["answer"], where, "answer", 0, 4)})
    if not out:
        raise ValueError(f"{mc_csv}: no rows after the header")
    return out
