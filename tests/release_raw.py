"""Tiny raw annotation files in the public releases' own formats (written here from the format
descriptions and the release code that reads them), plus the videos/images they name.

The JSON releases (MSR-VTT, MSRVTT-QA, DiDeMo, ActivityNet Captions, VQA, COCO, Visual Genome,
Karpathy's split) are single-line files, so these are too; TGIF-QA's and JSFusion's tables are
tab-separated with CRLF line ends and pandas-style quoting.
"""
import io
import json
import os

import numpy as np
from PIL import Image

from clipbert_legacy.preprocessing.make_demo_data import encode_mp4, render_video

SHAPES = ("circle", "square", "triangle")
COLORS = ("red", "green", "blue", "yellow")


def write(path, text):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return str(path)


def one_line_json(path, obj):
    return write(path, json.dumps(obj, ensure_ascii=False))


def table(path, header, rows, sep="\t"):
    return write(path, "\r\n".join([sep.join(header)] + [sep.join(r) for r in rows]) + "\r\n")


def _frames(i, n_frames=12):
    return render_video(COLORS[i % 4], SHAPES[i % 3], ("left", "right", "up", "down")[i % 4], seed=i,
                        size=64, n_frames=n_frames)


def videos(folder, stems, ext="mp4"):
    """One short clip per stem: mp4 (H.264) or an animated GIF (TGIF's)."""
    os.makedirs(folder, exist_ok=True)
    for i, stem in enumerate(stems):
        frames = _frames(i)
        if ext == "gif":
            ims = [Image.fromarray(f) for f in frames]
            buf = io.BytesIO()
            ims[0].save(buf, format="GIF", save_all=True, append_images=ims[1:], duration=100, loop=0)
            data = buf.getvalue()
        else:
            data = encode_mp4(frames, fps=10)
        with open(os.path.join(folder, f"{stem}.{ext}"), "wb") as f:
            f.write(data)
    return str(folder)


def images(folder, stems):
    os.makedirs(folder, exist_ok=True)
    for i, stem in enumerate(stems):
        Image.fromarray(np.ascontiguousarray(_frames(i, 1)[0])).save(os.path.join(folder, f"{stem}.jpg"),
                                                                    quality=90)
    return str(folder)


# --- MSR-VTT, JSFusion, MSRVTT-QA -------------------------------------------------------------------
def msrvtt(raw):
    """video0-2 train, video3 validate (train_val_videodatainfo.json), video4-5 test."""
    def info(vids, split0):
        return {"info": {"year": "2016"}, "videos": [
            {"category": 9, "url": f"https://www.youtube.com/watch?v=x{v}", "video_id": f"video{v}",
             "start time": 1.0, "end time": 11.0, "split": split0(v), "id": v} for v in vids],
            "sentences": [{"caption": f"a {COLORS[v % 4]} {SHAPES[v % 3]} moves {k}", "video_id": f"video{v}",
                           "sen_id": 10 * v + k} for v in vids for k in range(2)]}
    one_line_json(raw / "train_val_videodatainfo.json",
                  info(range(4), lambda v: "validate" if v == 3 else "train"))
    one_line_json(raw / "test_videodatainfo.json", info((4, 5), lambda v: "test"))
    write(raw / "MSRVTT_JSFUSION_test.csv", "key,vid_key,video_id,sentence\r\n"
          'ret0,msr4,video4,"a red circle, moving"\r\nret1,msr5,video5,a green square moves\r\n')
    opts = ["a red circle", 'a "green" square', "a blue triangle", "a yellow circle", "a red square"]
    table(raw / "MSR_MC_test.csv", ["key", "vid_key", "a1", "a2", "a3", "a4", "a5", "answer"],
          [["mc0", "msr4"] + ['"a ""red"" circle"'] + opts[1:] + ["0"],
           ["mc1", "msr5"] + opts + ["1"]])
    qa = raw / "MSRVTT-QA"
    answers = ["circle", "circle", "square", "square", "triangle"]  # --top_k 2 leaves "triangle" out
    one_line_json(qa / "train_qa.json", [{"answer": a, "category_id": 0, "id": i,
                                          "question": f"what is shown {i}", "video_id": i % 4}
                                         for i, a in enumerate(answers)])
    one_line_json(qa / "val_qa.json", [{"answer": "triangle", "category_id": 0, "id": 5,
                                        "question": "what is it", "video_id": 3},
                                       {"answer": "circle", "category_id": 0, "id": 6,
                                        "question": "who moves", "video_id": 2}])
    one_line_json(qa / "test_qa.json", [{"answer": "square", "category_id": 0, "id": 7,
                                         "question": "what moves", "video_id": 5}])
    return [f"video{v}" for v in range(6)]


# --- TGIF-QA --------------------------------------------------------------------------------------
TGIF_GIFS = [f"tumblr_n{i}abcd{i}o1_250" for i in range(6)]


def tgif(raw):
    g = TGIF_GIFS
    frame_head = ["gif_name", "question", "answer", "type", "vid_id", "key", "description"]
    frame = [[g[0], "what is red", "circle", "0", "FRAMEQA1", "1", "a red circle"],
             [g[1], 'what does the "man do', "dog", "0", "FRAMEQA2", "2", "x"],  # stray quote: text
             [g[2], "how many circles", "two", "1", "FRAMEQA3", "3", "x"],
             [g[3], "what is it", "circle", "0", "FRAMEQA4", "4", "x"],
             [g[0], "where is it", "room", "3", "FRAMEQA5", "5", "x"]]
    table(raw / "Train_frameqa_question.csv", frame_head, frame)
    table(raw / "Test_frameqa_question.csv", frame_head,
          [[g[4], "what is red", "circle", "0", "FRAMEQA9", "9", "x"], [g[5], "what is it", "cat", "0",
                                                                        "FRAMEQA10", "10", "x"]])
    mc_head = ["gif_name", "question", "a1", "a2", "a3", "a4", "a5", "answer", "vid_id", "key"]
    opts = ['"respond ""no"""', "nod", "wave", "run", "jump"]
    for task in ("action", "transition"):
        pre = task.upper()
        table(raw / f"Train_{task}_question.csv", mc_head,
              [[g[i], f"what does the man do {i}"] + opts + [str(i % 5), f"{pre}{i}", str(i)]
               for i in range(4)])
        table(raw / f"Test_{task}_question.csv", mc_head,
              [[g[i], "what does he do"] + opts + ["0", f"{pre}{i}", str(i)] for i in (4, 5)])
    return g


# --- DiDeMo, ActivityNet Captions -------------------------------------------------------------------
DIDEMO_VIDEOS = [f"1001{i}@N08_36550842{i}" for i in range(6)]


def didemo(raw):
    def moments(vids, start):
        return [{"annotation_id": start + 2 * i + k, "video": f"{v}.mov", "description": d,
                 "times": [[k, k], [k, k + 1]], "dl_link": "https://example.invalid"}
                for i, v in enumerate(vids) for k, d in enumerate((f"the {COLORS[i % 4]} shape moves",
                                                                   "camera zooms in"))]
    one_line_json(raw / "train_data.json", moments(DIDEMO_VIDEOS[:4], 0))
    one_line_json(raw / "val_data.json", moments(DIDEMO_VIDEOS[4:], 100))
    return DIDEMO_VIDEOS


ANET_VIDEOS = [f"v_Qo{i}SCBRmfW{i}" for i in range(6)]


def anet(raw):
    def entries(vids):
        return {v: {"duration": 12.0, "timestamps": [[0.0, 5.5], [5.5, 12.0]],
                    "sentences": [f"A {COLORS[i % 4]} shape appears. ", " It moves away."]}
                for i, v in enumerate(vids)}
    one_line_json(raw / "train.json", entries(ANET_VIDEOS[:4]))
    one_line_json(raw / "val_1.json", entries(ANET_VIDEOS[4:]))
    return ANET_VIDEOS


# --- COCO, Karpathy split, VQA 2.0, Visual Genome ---------------------------------------------------
COCO_TRAIN, COCO_VAL = (9, 25, 30, 34), (42, 73, 74, 80)  # Karpathy: 42 test, 73 + 80 val, 74 restval


def coco_stem(i):
    return f"COCO_{'val' if i in COCO_VAL else 'train'}2014_{i:012d}"


def coco(raw):
    for split, ids in (("train", COCO_TRAIN), ("val", COCO_VAL)):
        one_line_json(raw / f"captions_{split}2014.json", {
            "info": {}, "licenses": [],
            "images": [{"id": i, "file_name": coco_stem(i) + ".jpg", "height": 64, "width": 64} for i in ids],
            "annotations": [{"image_id": i, "id": 10 * i + k, "caption": f"A {COLORS[i % 4]} thing {k}."}
                            for i in ids for k in range(2)]})
    karpathy = {42: "test", 73: "val", 74: "restval", 80: "val"}
    one_line_json(raw / "dataset_coco.json", {"dataset": "coco", "images": [
        {"filepath": f"{'val' if i in COCO_VAL else 'train'}2014", "filename": coco_stem(i) + ".jpg",
         "imgid": n, "split": karpathy.get(i, "train"), "cocoid": i, "sentids": [], "sentences": []}
        for n, i in enumerate(COCO_TRAIN + COCO_VAL)]})
    return [coco_stem(i) for i in COCO_TRAIN + COCO_VAL]


def vqa(raw):
    answers = ("yes", "no", "2", "red")
    for split, ids in (("train2014", COCO_TRAIN), ("val2014", COCO_VAL)):
        qs = [{"image_id": i, "question": f"Is it thing {k}?", "question_id": 1000 * i + k}
              for i in ids for k in range(2)]
        one_line_json(raw / f"v2_OpenEnded_mscoco_{split}_questions.json",
                      {"info": {}, "task_type": "Open-Ended", "data_type": "mscoco", "license": {},
                       "data_subtype": split, "questions": qs})
        anns = []
        for q in qs:
            a = answers[(q["image_id"] + q["question_id"]) % 4]
            anns.append({"question_id": q["question_id"], "image_id": q["image_id"],
                         "question_type": "is it", "answer_type": "yes/no" if a in ("yes", "no") else "other",
                         "multiple_choice_answer": a,
                         "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": j + 1}
                                     for j in range(10)]})
        one_line_json(raw / f"v2_mscoco_{split}_annotations.json",
                      {"info": {}, "license": {}, "data_subtype": split, "annotations": anns})


VG_IMAGES = {1: 9, 2: 42, 3: None, 4: 73, 5: 25}  # VG image id -> COCO id (2 is a Karpathy-test image)


def visual_genome(raw):
    one_line_json(raw / "image_data.json", [{"image_id": v, "coco_id": c, "flickr_id": None, "width": 64,
                                             "height": 64, "url": f"https://example.invalid/{v}.jpg"}
                                            for v, c in VG_IMAGES.items()])
    one_line_json(raw / "region_descriptions.json", [
        {"id": v, "regions": [{"region_id": 10 * v + k, "image_id": v, "phrase": p, "x": 0, "y": 0,
                               "width": 10, "height": 10}
                              for k, p in enumerate((f"a {COLORS[v % 4]} shape", "", "the background"))]}
        for v in VG_IMAGES])
    one_line_json(raw / "question_answers.json", [  # qa_id 9000, 9001 are VQA question ids too
        {"id": v, "qas": [{"qa_id": 9000 + 10 * (v - 1) + k, "image_id": v, "question": q, "answer": a,
                           "a_objects": [], "q_objects": []}
                          for k, (q, a) in enumerate((("What color is it?", "Red."), ("Is it big?", "No"),
                                                      ("Why?", "because")))]}
        for v in VG_IMAGES])
    return [str(v) for v in VG_IMAGES]
