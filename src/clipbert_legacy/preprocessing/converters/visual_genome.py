"""Visual Genome -> the pretraining config's ``vg_{train,val}_captions.jsonl`` (region descriptions) and
the VQA config's ``vg_k_trainval.jsonl`` (question answers on COCO images).

Raw inputs (visualgenome.org, v1.2 names):

* ``region_descriptions.json``: ``[{"id": image id, "regions": [{region_id, image_id, phrase, x, y,
  width, height}]}]``
* ``question_answers.json``: ``[{"id": image id, "qas": [{qa_id, image_id, question, answer, ...}]}]``
* ``image_data.json``: ``[{image_id, coco_id (null when not a COCO image), url, width, height}]``

Held out everywhere: VG images that are held-out COCO images (the Karpathy test images with
``--karpathy_split``, else every val2014 image), so neither pretraining nor VQA trains on what their
evaluations score. Captions rows are ``{"vg_id": str(image id), "caption": phrase}`` (the key of
VG's ``{id}.jpg`` in a file2lmdb store); ``--n_val_images`` VG images (seeded) make the val file.
QA rows are the VQA dataset's ``{question, image_id, question_id, labels, answer_type}`` on the COCO
image (its file stem, the VQA store's key). ``question_id`` is ``"vg{qa_id}"``: the config trains on
this file together with VQA's, and the dataset requires ids unique across both. The answer is
normalised as VQA's, scored 1.0, and kept only when it is in the VQA answer vocabulary (ClipBERT's
loader raised KeyError on others). Blank phrases, blank questions/answers and out-of-vocabulary
answers are skipped and counted.
"""
import random

from clipbert_legacy.preprocessing.converters.common import need, read_json_items
from clipbert_legacy.preprocessing.converters.vqa import normalize_answer


def coco_ids(image_data):
    """{VG image id: integer COCO id} for the VG images that are COCO images."""
    out = {}
    for where, im in read_json_items(image_data, id_keys=("image_id", "id")):
        vid = im.get("image_id", im.get("id")) if isinstance(im, dict) else None
        if vid is None:
            raise ValueError(f"{where}: missing field 'image_id'")
        if im.get("coco_id") is not None:
            out[vid] = im["coco_id"]
    return out


def _per_image(path, list_key):
    """[(where, VG image id, entries)] of a VG per-image file."""
    out = []
    for where, im in read_json_items(path, id_keys=("id", "image_id")):
        need(im, where, (list_key,))
        vid = im.get("id", im.get("image_id"))
        if vid is None or not isinstance(im[list_key], list):
            raise ValueError(f"{where}: expected {{'id': image id, {list_key!r}: [...]}}")
        out.append((where, vid, im[list_key]))
    return out


def convert_vg_captions(regions_json, vg2coco, held_out, n_val_images, seed=42):
    """({"vg_train_captions", "vg_val_captions": rows}, skip counts)."""
    skipped = {"blank phrases": 0, "regions of held-out COCO images": 0}
    by_image = {}
    for _, vid, regions in _per_image(regions_json, "regions"):
        if vg2coco.get(vid) in held_out:
            skipped["regions of held-out COCO images"] += len(regions)
            continue
        for r in regions:
            phrase = r.get("phrase") if isinstance(r, dict) else None
            if not isinstance(phrase, str) or not phrase.strip():
                skipped["blank phrases"] += 1
                continue
            by_image.setdefault(vid, []).append(phrase.strip())
    images = sorted(by_image, key=str)
    if not 0 < n_val_images < len(images):
        raise ValueError(f"--n_val_images {n_val_images} must be in 1..{len(images) - 1} (VG images with "
                         f"phrases: {len(images)})")
    val = set(random.Random(seed).sample(images, n_val_images))
    out = {"vg_train_captions": [], "vg_val_captions": []}
    for vid, phrases in by_image.items():
        name = "vg_val_captions" if vid in val else "vg_train_captions"
        out[name] += [{"vg_id": str(vid), "caption": p} for p in phrases]
    return out, skipped


def answer_type(answer):
    """VQA's answer types from the answer alone: yes/no, number, other."""
    if answer in ("yes", "no"):
        return "yes/no"
    return "number" if answer.replace(" ", "").isdigit() else "other"


def convert_vg_qa(qa_json, vg2coco, coco_stems, held_out, ans2label):
    """({"vg_k_trainval": rows}, skip counts)."""
    skipped = {"QAs on non-COCO images": 0, "QAs on held-out COCO images": 0, "blank questions/answers": 0,
               "answers outside the VQA vocabulary": 0}
    rows = []
    for _, vid, qas in _per_image(qa_json, "qas"):
        coco = vg2coco.get(vid)
        if coco is None or coco not in coco_stems:
            skipped["QAs on non-COCO images"] += len(qas)
            continue
        if coco in held_out:
            skipped["QAs on held-out COCO images"] += len(qas)
            continue
        for i, qa in enumerate(qas):
            q, a = (qa.get("question"), qa.get("answer")) if isinstance(qa, dict) else (None, None)
            if not (isinstance(q, str) and q.strip() and isinstance(a, str) and a.strip()):
                skipped["blank questions/answers"] += 1
                continue
            ans = normalize_answer(a)
            if ans not in ans2label:
                skipped["answers outside the VQA vocabulary"] += 1
                continue
            rows.append({"question": q.strip(), "image_id": coco_stems[coco],
                         "question_id": f"vg{qa['qa_id']}" if "qa_id" in qa else f"vg{vid}_{i}",
                         "labels": {ans: 1.0},
                         "answer_type": answer_type(ans)})
    if not rows:
        raise ValueError(f"{qa_json}: no question on a training COCO image has an answer in the VQA "
                         f"vocabulary ({sum(skipped.values())} skipped: {skipped})")
    return {"vg_k_trainval": rows}, skipped
