"""COCO captions -> the pretraining config's ``coco_{train,val}_captions.jsonl``; COCO image lookups
shared with the VQA and Visual Genome converters.

Raw inputs (their download names):

* ``captions_train2014.json`` / ``captions_val2014.json`` (cocodataset.org annotations): ``{"images":
  [{id, file_name, ...}], "annotations": [{id, image_id, caption}]}``.
* optional ``dataset_coco.json`` (Karpathy's split file, as used by ClipBERT, UNITER, BLIP): ``{"images":
  [{cocoid, filepath, filename, split: train|restval|val|test}]}``.

Rows are ``{"coco_id": key, "caption"}`` with ``key`` the image's file stem
(``COCO_val2014_000000000042``), file2lmdb's key in the store of train2014+val2014 images that the
VQA config shares. Splits: with the Karpathy file, train = its train + restval images, val = its val
images, and its 5,000 test images are held out (as in ClipBERT's pretraining, which evaluated
retrieval on them); without it, train = captions_train2014, val = captions_val2014 (the Karpathy test
images are val2014 images, so they are held out of training either way).
"""
from clipbert_legacy.preprocessing.converters.common import need, read_json_items, text_of

KARPATHY_SPLITS = ("train", "restval", "val", "test")


def karpathy_splits(path):
    """{integer COCO id: Karpathy split} from ``dataset_coco.json``."""
    out = {}
    for where, im in read_json_items(path, "images", ("cocoid", "filename")):
        need(im, where, ("cocoid", "split"))
        if im["split"] not in KARPATHY_SPLITS:
            raise ValueError(f"{where}: split must be one of {KARPATHY_SPLITS}, got {im['split']!r}")
        out[im["cocoid"]] = im["split"]
    if not out:
        raise ValueError(f"{path}: no images")
    return out


def image_stems(paths):
    """{integer COCO id: file stem} from the ``images`` lists of COCO annotation files."""
    out = {}
    for path in paths:
        for where, im in read_json_items(path, "images", ("id", "file_name")):
            need(im, where, ("id", "file_name"))
            out[im["id"]] = text_of(im, "file_name", where).rsplit(".", 1)[0]
    return out


def read_captions(path):
    """[(integer image id, image stem, caption)] of one COCO captions file, in file order; blank
    captions are skipped and counted: (rows, n_blank)."""
    stems = image_stems([path])
    rows, blank = [], 0
    for where, a in read_json_items(path, "annotations", ("id", "image_id")):
        need(a, where, ("image_id", "caption"))
        if a["image_id"] not in stems:
            raise ValueError(f"{where}: image_id {a['image_id']!r} is not in the file's 'images' list")
        if not isinstance(a["caption"], str) or not a["caption"].strip():
            blank += 1
            continue
        rows.append((a["image_id"], stems[a["image_id"]], a["caption"].strip()))
    if not rows:
        raise ValueError(f"{path}: no captions")
    return rows, blank


def convert_coco_captions(train_json, val_json, karpathy=None):
    """({"coco_train_captions", "coco_val_captions": rows}, counts of what was left out)."""
    split_of = karpathy_splits(karpathy) if karpathy else None
    out = {"coco_train_captions": [], "coco_val_captions": []}
    skipped = {"blank captions": 0, "Karpathy-test captions": 0, "images outside the Karpathy file": 0}
    for path, default in ((train_json, "coco_train_captions"), (val_json, "coco_val_captions")):
        rows, blank = read_captions(path)
        skipped["blank captions"] += blank
        for image_id, stem, caption in rows:
            name = default
            if split_of is not None:
                split = split_of.get(image_id)
                if split is None:
                    skipped["images outside the Karpathy file"] += 1
                    continue
                if split == "test":
                    skipped["Karpathy-test captions"] += 1
                    continue
                name = "coco_val_captions" if split == "val" else "coco_train_captions"
            out[name].append({"coco_id": stem, "caption": caption})
    for name, rows in out.items():
        if not rows:
            raise ValueError(f"no captions for {name}.jsonl (check the Karpathy split file {karpathy})")
    return out, skipped


def held_out_ids(val_ids, karpathy=None):
    """Integer COCO ids whose questions/captions stay out of training: the Karpathy test images, or
    (without the Karpathy file) ``val_ids``, every val2014 image."""
    if karpathy:
        return {i for i, s in karpathy_splits(karpathy).items() if s == "test"}
    return set(val_ids)
